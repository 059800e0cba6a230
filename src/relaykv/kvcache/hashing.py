"""Deterministic chained block hashes (docs/design.md §2).

`h_k = H(h_{k-1} || extra_k || tokens[k*u:(k+1)*u])` over hash units of `u` tokens, with a fixed
seed for `h_{-1}`, so equal hashes mean equal whole prefixes in every process and on every
host (P and D must agree; Python's salted `hash()` is never used). H is XXH3-128: fast enough
that hashing a 64k-token prompt costs well under a millisecond, and 128 bits keep accidental
collisions out of reach. Token ids are hashed as little-endian int32 whatever the host.

`extra_k` carries the per-request cache salt on the first unit only, so tenants with
different salts never share a prefix, and nothing else changes later units.

Under `eagle_reuse=successor` (§4) draft groups key a block by `S(h_k, token after the unit)`,
so the key itself proves the next token and no peek block is needed.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import numpy as np
import xxhash

_H = xxhash.xxh3_128_digest
SEED_HASH: bytes = _H(b"relaykv/block-hash/v1")
_SALT_TAG = b"relaykv/salt\x00"
_SUCCESSOR_TAG = b"relaykv/successor\x00"


def token_bytes(tokens: Sequence[int] | np.ndarray | array[int]) -> bytes:
    """Little-endian int32 bytes of a token sequence (the hashed representation)."""
    if isinstance(tokens, np.ndarray):
        return tokens.astype("<i4", copy=False).tobytes()
    if isinstance(tokens, array) and tokens.typecode == "i" and array("i").itemsize == 4:
        return tokens.tobytes() if np.little_endian else np.frombuffer(tokens, "<i4").tobytes()
    return np.asarray(tokens, dtype="<i4").tobytes()


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
    step = unit * 4
    full = len(data) - len(data) % step
    h = SEED_HASH if parent is None else parent
    out: list[bytes] = []
    append = out.append
    if full and first_extra:
        h = _H(h + first_extra + data[:step])
        append(h)
        start = step
    else:
        start = 0
    for i in range(start, full, step):
        h = _H(h + data[i : i + step])
        append(h)
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

    def extend(self, tokens: Sequence[int] | np.ndarray | array[int] | Iterable[int]) -> None:
        if not isinstance(tokens, (np.ndarray, array, list, tuple)):
            tokens = list(tokens)
        data = self._pending + token_bytes(tokens)
        parent = self.hashes[-1] if self.hashes else None
        extra = self.salt_extra if not self.hashes else b""
        new = chain_hashes(data, self.unit, parent, extra)
        self.hashes.extend(new)
        self._pending = data[len(new) * self.unit * 4 :]

    def __len__(self) -> int:
        return len(self.hashes)
