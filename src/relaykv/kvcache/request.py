"""Per-request cache state: tokens, unit hashes, per-group keys and block tables.

The scheduler owns the request; the cache manager owns this record (one per live request) and
is the only writer of its block tables.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from enum import Enum

import numpy as np

from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.hashing import TokenHashes, successor_key


class CacheRole(Enum):
    """How the request uses the cache: a normal request, or one side of a P/D transfer."""

    COLOCATED = "colocated"
    PREFILL = "prefill"  # computed here, KV sent to a decode engine afterwards
    DECODE = "decode"  # KV received from a prefill engine, decoded here


class CacheRequest:
    """One request as the cache sees it."""

    __slots__ = (
        "_keys",
        "_rules",
        "hashes",
        "junction",
        "load",
        "num_cached_blocks",
        "num_prompt_tokens",
        "request_id",
        "role",
        "tables",
        "tokens",
    )

    def __init__(
        self,
        request_id: str,
        prompt: Sequence[int] | np.ndarray,
        rules: tuple[GroupRules, ...],
        hash_unit: int,
        salt: str | bytes | None = None,
        role: CacheRole = CacheRole.COLOCATED,
    ) -> None:
        self.request_id = request_id
        self.tokens = array("i", prompt.tolist() if isinstance(prompt, np.ndarray) else prompt)
        self.num_prompt_tokens = len(self.tokens)
        self.role = role
        self._rules = rules
        self.hashes = TokenHashes(hash_unit, salt)
        self.hashes.extend(self.tokens)
        self._keys: list[list[bytes]] = [[] for _ in rules]
        self.tables: list[list[int]] = [[] for _ in rules]
        # Leading blocks of each table already considered for hashing (§3: a block is
        # hashed at most once, when full and written).
        self.num_cached_blocks: list[int] = [0] * len(rules)
        self.junction = 0  # shared-prefix boundary found by this request's lookup (§6)
        self.load: object | None = None  # the in-flight P/D load this request waits on

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def append_tokens(self, token_ids: Iterable[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(token_ids)
        self.hashes.extend(self.tokens[start:])

    def keys(self, group: int) -> list[bytes]:
        """Keys of this request's full blocks in `group` (§2), extended lazily."""
        keys = self._keys[group]
        rule = self._rules[group]
        ratio = rule.block_size // self.hashes.unit
        hashes = self.hashes.hashes
        if rule.successor_keys:
            # A successor key also proves the token after the block (§4).
            total = min(len(hashes) // ratio, (len(self.tokens) - 1) // rule.block_size)
            tokens, b = self.tokens, rule.block_size
            for k in range(len(keys), max(total, 0)):
                keys.append(successor_key(hashes[(k + 1) * ratio - 1], tokens[(k + 1) * b]))
        elif ratio == 1:
            if len(keys) < len(hashes):
                keys.extend(hashes[len(keys) :])
        else:
            total = len(hashes) // ratio
            if len(keys) < total:
                keys.extend(hashes[(len(keys) + 1) * ratio - 1 : total * ratio : ratio])
        return keys

    def __repr__(self) -> str:
        return (
            f"CacheRequest({self.request_id!r}, tokens={self.num_tokens}, role={self.role.value}, "
            f"blocks={[len(t) for t in self.tables]})"
        )
