"""Deterministic chained block hashes (docs/design.md §2).

`h_k = H(h_{k-1} || extra_k || tokens[k*u:(k+1)*u])` over hash units of `u` tokens, with a fixed
seed for `h_{-1}`, so equal hashes mean equal whole prefixes in every process and on every
host (P and D must agree; Python's salted `hash()` is never used). H is XXH3-128: fast enough
that hashing a 64k-token prompt costs well under a millisecond, and 128 bits keep accidental
collisions out of reach. Token ids are hashed as little-endian int32 whatever the host.

`extra_k` carries the per-request cache salt on the first unit only, so tenants with
different salts never share a prefix, and nothing else changes later units.

`PrefixChains` memoises the chain of recently hashed prompt segments for a caller that hashes
many prompts sharing prefixes (the router: requests sharing a system prompt share its chain).
It returns exactly what `chain_hashes` returns: an entry is found under what the segment's
hashes depend on, the parent hash and the salt bytes as they are and the segment's token bytes
by a digest, and used only when those token bytes are equal, so a digest collision can cost a
recomputation, never a wrong hash.

Under `eagle_reuse=successor` (§4) draft groups key a block by `S(h_k, token after the unit)`,
so the key itself proves the next token and no peek block is needed.

Converting a token list and running the chain are done by the optional C accelerator
(`relaykv.kvcache.accel`) when it was built; otherwise by the pure-Python code, which is the
reference it is tested against (`tests/kvcache/test_accel.py`). Both give the same bytes,
the same hashes and the same errors; xxhash computes every hash either way.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np
import xxhash

import relaykv.kvcache.accel as accel
from relaykv.kvcache.accel import int32_bytes

_H = xxhash.xxh3_128_digest
SEED_HASH: bytes = _H(b"relaykv/block-hash/v1")
_SALT_TAG = b"relaykv/salt\x00"
_SUCCESSOR_TAG = b"relaykv/successor\x00"
_segment_digest = _H  # how `PrefixChains` finds a segment (a test makes it collide)


def token_bytes(tokens: Sequence[int] | np.ndarray | array[int]) -> bytes:
    """Little-endian int32 bytes of a token sequence (the hashed representation)."""
    if isinstance(tokens, np.ndarray):
        return tokens.astype("<i4", copy=False).tobytes()
    if isinstance(tokens, array) and tokens.typecode == "i" and array("i").itemsize == 4:
        return tokens.tobytes() if np.little_endian else np.frombuffer(tokens, "<i4").tobytes()
    return int32_bytes(tokens)


def salt_prefix(salt: str | bytes | None) -> bytes:
    """The extra bytes hashed into the first unit for a cache salt (empty without one)."""
    if salt is None or salt == "" or salt == b"":
        return b""
    raw = salt.encode() if isinstance(salt, str) else bytes(salt)
    return _SALT_TAG + len(raw).to_bytes(4, "little") + raw


def chain_hashes(
    data: bytes, unit: int, parent: bytes | None = None, first_extra: bytes = b""
) -> list[bytes]:
    """Hashes of every full unit of `data` (int32 token bytes), chained from `parent`.

    `first_extra` is mixed into the first unit hashed here; pass it only when the chain
    starts at unit 0 (the salt rule of §2).
    """
    if accel.native is None:
        return _chain_py(data, unit, parent, first_extra)
    # The whole chain in one C call (module docstring).
    start = SEED_HASH if parent is None else parent
    hashes: list[bytes] = accel.native.chain(data, unit * 4, start, first_extra, _H)
    return hashes


def _chain_py(
    data: bytes, unit: int, parent: bytes | None = None, first_extra: bytes = b""
) -> list[bytes]:
    """`chain_hashes` without the accelerator: the chain driven from C by `map`."""
    step = unit * 4
    full = len(data) - len(data) % step
    h = SEED_HASH if parent is None else parent
    if not full:
        return []
    if first_extra:
        h = _H(h + first_extra + data[:step])
        if full == step:
            return [h]
        out = [h]
        units = _units(data[step:full], step)
    else:
        out = [h]  # the parent, dropped below
        units = _units(data[:full], step)
    # The chain runs in C (benchmarks/bench_router.py: a router hashes every 64k-token prompt
    # it routes): `map` reads `out`, which `extend` grows one hash at a time, so each unit is
    # concatenated to the hash just appended. A list iterator sees items appended while it
    # runs; the length check below proves it did.
    start = len(out)
    out.extend(map(_H, map(_CONCAT, out, units)))
    if len(out) - start != len(units):  # an interpreter whose iterator stopped early
        return _chain_loop(data, unit, parent, first_extra)
    return out if first_extra else out[1:]


_CONCAT = bytes.__add__


def _units(data: bytes, step: int) -> list[bytes]:
    """`data` (a multiple of `step` bytes) cut into `step`-byte units, in one C call."""
    units: list[bytes] = np.frombuffer(data, dtype=np.dtype((np.void, step))).tolist()
    return units


def _chain_loop(
    data: bytes, unit: int, parent: bytes | None = None, first_extra: bytes = b""
) -> list[bytes]:
    """`chain_hashes` as a plain loop: the reference the C-driven form is tested against."""
    step = unit * 4
    full = len(data) - len(data) % step
    h = SEED_HASH if parent is None else parent
    out: list[bytes] = []
    for start in range(0, full, step):
        extra = first_extra if start == 0 else b""
        h = _H(h + extra + data[start : start + step])
        out.append(h)
    return out


class PrefixChains:
    """A bounded LRU of unit-hash chains of prompt segments (see the module docstring).

    A prompt's token bytes are cut into segments of `segment_units` hash units from unit 0;
    each full segment's hashes are kept under (parent hash, salt bytes, digest of the segment's
    bytes) with those bytes (compared before use: `_segment_digest` may collide), so a
    prompt that shares its first segments with a recent one reuses their hashes and hashes
    only the rest. At most `max_segments` segments are kept (least recently used go first).
    """

    __slots__ = ("_entries", "hits", "max_segments", "misses", "segment_units")

    def __init__(self, segment_units: int = 256, max_segments: int = 256) -> None:
        if segment_units < 1 or max_segments < 1:
            raise ValueError("segment_units and max_segments must be >= 1")
        self.segment_units = segment_units
        self.max_segments = max_segments
        self._entries: OrderedDict[tuple[bytes, bytes, bytes], tuple[bytes, list[bytes]]] = (
            OrderedDict()
        )
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def chain(self, data: bytes, unit: int, first_extra: bytes = b"") -> list[bytes]:
        """`chain_hashes(data, unit, None, first_extra)`, reusing memoised segments."""
        seg = self.segment_units * unit * 4
        whole = len(data) - len(data) % seg
        out: list[bytes] = []
        parent = SEED_HASH
        entries = self._entries
        entry_of = entries.get
        view = memoryview(data)  # a found segment is digested and compared without a copy
        start = 0
        # Memoised segments from unit 0 on, while they are found ...
        while start < whole:
            digest = _segment_digest(view[start : start + seg])
            key = (parent, first_extra if start == 0 else b"", digest)
            entry = entry_of(key)
            if entry is None or len(entry[0]) != seg or not data.startswith(entry[0], start):
                break
            entries.move_to_end(key)
            hashes = entry[1]
            self.hits += 1
            out.extend(hashes)
            parent = hashes[-1]
            start += seg
        if start == len(data):
            return out
        # ... then the rest in one chain (one C-driven call, not one per segment), whose
        # full segments are memoised for the prompts that follow.
        first = len(out)
        rest = chain_hashes(data[start:], unit, parent, first_extra if start == 0 else b"")
        if out:
            out.extend(rest)
        else:  # nothing found: the chain's own list (no copy of its references)
            out = rest
        per_seg = self.segment_units
        limit = self.max_segments
        for at in range(start, whole, seg):
            piece = data[at : at + seg]
            hashes = out[first : first + per_seg]
            entries[parent, first_extra if at == 0 else b"", _segment_digest(piece)] = (
                piece,
                hashes,
            )
            if len(entries) > limit:
                entries.popitem(last=False)
            parent = hashes[-1]
            first += per_seg
        self.misses += (whole - start) // seg
        return out


def successor_key(unit_hash: bytes, next_token: int) -> bytes:
    """Key of a draft-group block under `eagle_reuse=successor`: proves the next token too."""
    return _H(unit_hash + _SUCCESSOR_TAG + int(next_token).to_bytes(4, "little", signed=True))


class TokenHashes:
    """The growing list of unit hashes of one request's tokens (prompt, then outputs).

    Only full units are hashed; a partial tail waits until it fills (§2).
    """

    __slots__ = ("_pending", "hashes", "salt_extra", "unit")

    def __init__(self, unit: int, salt: str | bytes | None = None) -> None:
        self.unit = unit
        self.salt_extra = salt_prefix(salt)
        self.hashes: list[bytes] = []
        self._pending = b""

    def extend(
        self,
        tokens: Sequence[int] | np.ndarray | array[int] | Iterable[int],
        chains: PrefixChains | None = None,
    ) -> None:
        """Hash the units `tokens` completes; `chains` memoises a prompt's first hashing."""
        if not isinstance(tokens, (np.ndarray, array, list, tuple)):
            tokens = list(tokens)
        self.extend_bytes(token_bytes(tokens), chains)

    def extend_bytes(self, data: bytes, chains: PrefixChains | None = None) -> None:
        """`extend` for tokens given as their little-endian int32 bytes (`int32_bytes`)."""
        data = self._pending + data
        if chains is not None and not self.hashes and not self._pending:
            new = chains.chain(data, self.unit, self.salt_extra)
        else:
            parent = self.hashes[-1] if self.hashes else None
            extra = self.salt_extra if not self.hashes else b""
            new = chain_hashes(data, self.unit, parent, extra)
        if self.hashes:
            self.hashes.extend(new)
        else:  # the first hashing: its list is a new one (no copy of 4,096 references)
            self.hashes = new
        self._pending = data[len(new) * self.unit * 4 :]

    def __len__(self) -> int:
        return len(self.hashes)
