"""The optional C accelerator of the cache's hot loops, and its pure-Python equivalents.

`relaykv.kvcache._accel` (`_accel.c`) is built by `pip install -e .` where a C compiler and
Python's headers are found (an optional extension: without them the install goes on). A
router converts, hashes and probes every 64k-token prompt it routes, and those passes are
most of a routing decision in pure Python (docs/routing.md "Cost"). Every function here gives
the same result and the same errors with or without it; the pure-Python forms are the
references `tests/kvcache/test_accel.py` checks the C forms against. `native` is the C module
or None (tests set it to None to run the fallback).
"""

from __future__ import annotations

import importlib
import operator
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from types import ModuleType

import numpy as np

native: ModuleType | None
try:
    native = importlib.import_module("relaykv.kvcache._accel")
except ImportError:  # not built (no compiler at install time): the pure-Python path
    native = None


def _bind_xxh3() -> bool:
    """Let the C chain call xxhash's own XXH3_128bits from xxhash's extension module (one
    reused buffer, no Python call per unit) once it gives `xxh3_128_digest`'s digests;
    False where it cannot (the chain then calls `xxh3_128_digest`)."""
    bind = getattr(native, "bind_xxh3", None)  # None: an accelerator built before it existed
    if bind is None:
        return False
    import xxhash

    module = getattr(xxhash, "_xxhash", None)
    path = getattr(module, "__file__", None)
    return isinstance(path, str) and bool(bind(path, xxhash.xxh3_128_digest))


direct_xxh3 = _bind_xxh3()  # whether the C chain calls XXH3_128bits itself


def int32_bytes(tokens: Iterable[int], strict: bool = False) -> bytes:
    """Little-endian int32 bytes of token ids read with `__index__` (ints, numpy integers;
    `strict`: exact ints only, as a JSON body's ids are, so `true` is refused).

    Raises TypeError for an id that is not an integer and OverflowError for one outside
    int32, naming its position.
    """
    seq = tokens if isinstance(tokens, list | tuple) else list(tokens)
    if native is not None:
        data: bytes = native.int32_bytes(seq, strict)
        return data
    return int32_bytes_py(seq, strict)


def int32_bytes_py(tokens: Sequence[int], strict: bool = False) -> bytes:
    """`int32_bytes` in Python (`struct`, then a scan naming the id it refused)."""
    try:
        if not strict or set(map(type, tokens)) <= {int}:
            return struct.pack(f"<{len(tokens)}i", *tokens)
    except struct.error:
        pass
    for i, token in enumerate(tokens):
        try:
            if strict and type(token) is not int:
                raise TypeError
            value = operator.index(token)
        except TypeError:
            raise TypeError(
                f"token id at position {i} is not an integer: {type(token).__name__}"
            ) from None
        if not -(2**31) <= value < 2**31:
            raise OverflowError(
                f"token id {token!r} at position {i} is outside int32 [-2**31, 2**31)"
            )
    raise ValueError("token ids could not be packed as int32")  # struct refused nothing


def slot_counts(masks: np.ndarray) -> tuple[list[int], list[int]] | None:
    """For a uint64 array of bitmasks (one per prompt key; bit s: engine slot s holds it),
    per slot 0..63 the keys held (`slot_held_py`) and the run of held keys from key 0
    (`slot_run_py`), in one C pass; None without the accelerator (ask slot by slot)."""
    count = getattr(native, "slot_counts", None)  # None: not built, or built before it
    if count is None:
        return None
    held, runs = count(np.ascontiguousarray(masks, dtype=np.uint64))
    return held, runs


def slot_held_py(masks: np.ndarray, slot: int) -> int:
    """How many of `masks` have bit `slot` (`slot_counts` for one slot, in numpy)."""
    return int(np.count_nonzero(masks & np.uint64(1 << slot)))


def slot_run_py(held_from_0: np.ndarray, slot: int) -> int:
    """How many masks from the first on all have bit `slot`, given `held_from_0`, the
    masks' `np.bitwise_and.accumulate` (`slot_counts` for one slot, in numpy): a slot's bit
    only clears along it, so it is set exactly on that run."""
    return int(np.count_nonzero(held_from_0 & np.uint64(1 << slot)))


def values_u64(mapping: Mapping[bytes, int], keys: Sequence[bytes]) -> np.ndarray:
    """Per key, `mapping.get(key, 0)` as a uint64 array (values are ints in [0, 2**64))."""
    if native is not None and type(mapping) is dict and isinstance(keys, list | tuple):
        return np.frombuffer(native.values_u64(mapping, keys), dtype=np.uint64)
    return values_u64_py(mapping, keys)


def values_u64_py(mapping: Mapping[bytes, int], keys: Sequence[bytes]) -> np.ndarray:
    """`values_u64` in Python (one C-driven pass of `mapping.get`)."""
    return np.fromiter(map(mapping.get, keys, repeat(0)), dtype=np.uint64, count=len(keys))


def _mask_bits(bits: int) -> int:
    """`bits` checked as the C table checks them: an int in [0, 2**64)."""
    if not isinstance(bits, int):
        raise TypeError(f"bits must be an int, not {type(bits).__name__}")
    if not 0 <= bits < 2**64:
        raise OverflowError(f"bits {bits} outside [0, 2**64)")
    return bits


class KeyMasksPy:
    """`KeyMasks` in Python: a dict of key -> non-zero uint64 bitmask (the reference the C
    table is tested against, and the fallback without the accelerator)."""

    __slots__ = ("_masks",)

    def __init__(self, seed: bytes = b"") -> None:
        self._masks: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._masks)

    def or_bits(self, keys: Iterable[bytes], bits: int) -> None:
        """Each key's mask |= `bits`."""
        masks, get = self._masks, self._masks.get
        if _mask_bits(bits):
            for key in keys:
                masks[key] = get(key, 0) | bits

    def clear_bits(self, keys: Iterable[bytes], bits: int) -> None:
        """Each key's mask &= ~`bits`; a key left with none is removed."""
        if not _mask_bits(bits):
            return
        masks, keep = self._masks, ~bits
        for key in keys:
            mask = masks.get(key)
            if mask is not None:
                mask &= keep
                if mask:
                    masks[key] = mask
                else:
                    del masks[key]

    def values(self, keys: Sequence[bytes]) -> np.ndarray:
        """Per key, its mask as a uint64 array (0: absent)."""
        return values_u64(self._masks, keys)

    def items(self) -> list[tuple[bytes, int]]:
        return list(self._masks.items())


class _NativeKeyMasks:
    """The C `KeyMasks` behind `KeyMasksPy`'s interface (values as a numpy array)."""

    __slots__ = ("_table",)

    def __init__(self, seed: bytes) -> None:
        assert native is not None
        self._table = native.KeyMasks(seed)

    def __len__(self) -> int:
        return len(self._table)

    def or_bits(self, keys: Iterable[bytes], bits: int) -> None:
        self._table.or_bits(keys if isinstance(keys, list | tuple) else list(keys), bits)

    def clear_bits(self, keys: Iterable[bytes], bits: int) -> None:
        self._table.clear_bits(keys if isinstance(keys, list | tuple) else list(keys), bits)

    def values(self, keys: Sequence[bytes]) -> np.ndarray:
        seq = keys if isinstance(keys, list | tuple) else list(keys)
        return np.frombuffer(self._table.values(seq), dtype=np.uint64)

    def items(self) -> list[tuple[bytes, int]]:
        items: list[tuple[bytes, int]] = self._table.items()
        return items


KeyMasks = KeyMasksPy | _NativeKeyMasks


def key_masks() -> KeyMasks:
    """A map of keys to engine bitmasks (`relaykv.router.holders`): the C table where the
    accelerator is built (a random seed per table), else the dict."""
    if native is not None and hasattr(native, "KeyMasks"):
        return _NativeKeyMasks(os.urandom(16))
    return KeyMasksPy()
