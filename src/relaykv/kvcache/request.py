"""Per-request cache state: tokens, unit hashes, per-group keys, block tables, and the P/D
load a decode-side request waits on (docs/design.md §10).

The scheduler owns the request; the cache manager owns these records (one `CacheRequest` per
live request, at most one `KVLoad` each) and is the only writer of their block tables. The
load lives here, next to the request it fills, so that there is exactly one pointer to it:
`CacheRequest.load`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from relaykv.kvcache.accel import int32_bytes
from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.hashing import PrefixChains, TokenHashes, successor_key
from relaykv.kvcache.pd_config import Role
from relaykv.kvcache.pd_plan import PDPlan

# How a request uses the cache: a normal request, or one side of a P/D transfer.
CacheRole = Role


def _int32_array(prompt: Sequence[int] | np.ndarray) -> tuple[array[int], bytes | None]:
    """The prompt as an int32 array, and for a list, a tuple or an int32 array its
    little-endian int32 bytes too (what the hashes are computed from, `accel.int32_bytes` in
    C where built; the router's intake hands its bytes on instead, `token_bytes`;
    docs/routing.md "Cost")."""
    if isinstance(prompt, array) and prompt.typecode == "i" and prompt.itemsize == 4:
        out = prompt[:]  # a copy: the request may grow its own
        return out, out.tobytes() if np.little_endian else None
    if isinstance(prompt, list | tuple) and array("i").itemsize == 4:
        data = int32_bytes(prompt)
        out = array("i")
        out.frombytes(data)
        if not np.little_endian:
            out.byteswap()
        return out, data
    return array("i", prompt.tolist() if isinstance(prompt, np.ndarray) else prompt), None


class CacheRequest:
    """One request as the cache sees it."""

    __slots__ = (
        "_keys",
        "_rules",
        "copies",
        "hashes",
        "junction",
        "load",
        "num_admissions",
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
        chains: PrefixChains | None = None,
        token_bytes: bytes | None = None,
    ) -> None:
        """`chains`: a memo of recently hashed prefixes (the router's; §2); `token_bytes`:
        the prompt's little-endian int32 bytes where the caller converted it already
        (`accel.int32_bytes`: the router's intake), hashed as they are."""
        self.request_id = request_id
        self.tokens: array[int] | memoryview
        if token_bytes is None:
            self.tokens, data = _int32_array(prompt)
        else:
            if len(token_bytes) != 4 * len(prompt):
                raise ValueError("token_bytes must hold the prompt's ids as int32")
            data = token_bytes
            if np.little_endian and array("i").itemsize == 4:
                # Read in place (a router's request: no 256 KB copy for a 64k-token prompt);
                # `append_tokens` makes it an array first.
                self.tokens = memoryview(token_bytes).cast("i")
            else:
                self.tokens = array("i")
                self.tokens.frombytes(token_bytes)
                self.tokens.byteswap()
        self.num_prompt_tokens = len(self.tokens)
        self.role = role
        self._rules = rules
        self.hashes = TokenHashes(hash_unit, salt)
        if data is None:
            self.hashes.extend(self.tokens, chains)
        else:
            self.hashes.extend_bytes(data, chains)
        self._keys: list[list[bytes]] = [[] for _ in rules]
        self.tables: list[list[int]] = [[] for _ in rules]
        # Leading blocks of each table already considered for hashing (§3: a block is
        # hashed at most once, when full and written).
        self.num_cached_blocks: list[int] = [0] * len(rules)
        self.junction = 0  # shared-prefix boundary found by this request's lookup (§6)
        self.load: KVLoad | None = None  # the P/D load this request waits on (decode side)
        self.num_admissions = 0  # > 0 after a preemption: the next admission is a re-admission
        # `(group, source block, private block)` page copies the request's next step makes
        # before it computes (`eagle_reuse=recompute`, §4); the sources stay held until then.
        self.copies: list[tuple[int, int, int]] = []

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def append_tokens(self, token_ids: Iterable[int]) -> None:
        if isinstance(self.tokens, memoryview):  # given as bytes: now a growable copy
            grown = array("i")
            grown.frombytes(self.tokens.cast("B"))
            self.tokens = grown
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
            # A block is one hash unit: its keys are the unit hashes, so the group's list is
            # the hashes list itself (no copy of 4,096 references for a 64k-token prompt),
            # which grows with it. Callers only read it.
            if keys is not hashes:
                keys = self._keys[group] = hashes
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


class LoadState(Enum):
    """The state of a load's OWN transfer (shared transfers it waits on have their own)."""

    PENDING = "pending"  # the transport may still be writing into the blocks
    DONE = "done"  # received and verified (or nothing to receive)
    FAILED = "failed"  # nothing usable arrived; the blocks are scratch


@dataclass(eq=False, slots=True)
class KVLoad:
    """One request's load of its prompt's KV from a prefill engine (§7).

    `receive[g]` lists the `(block index, D block id)` pairs the transport must fill; `local`
    the blocks reused from D's cache; `attached` the blocks another in-flight load brings
    (`waits_on` those loads); `from_tier` the `(block index, D block id, tier slot)` triples
    D's KV tier fills (a shared store holds what a prefill engine put: docs/tier.md), whose
    job's state is `tier_state`. The load is `settled` when its own transfer, its tier job
    and every transfer it waits on ended, `ok` when all succeeded, and `delivered` once the
    cache handed it to its request (block tables usable, `request.load` cleared).
    """

    load_id: int
    request: CacheRequest
    plan: PDPlan
    local: list[dict[int, int]]  # per group: block index -> reused local block
    attached: list[dict[int, int]]  # per group: block index -> block another load brings
    receive: list[list[tuple[int, int]]]  # per group: (block index, D block id) to fill
    local_tokens: int
    junction: int = 0
    state: LoadState = LoadState.PENDING
    waits_on: set[KVLoad] = field(default_factory=set)
    waiters: list[KVLoad] = field(default_factory=list)
    abandoned: bool = False  # its request was released while the transfer flew
    delivered: bool = False
    from_tier: list[list[tuple[int, int, int]]] = field(default_factory=list)
    tier_state: LoadState = LoadState.DONE  # PENDING while its tier job flies

    @property
    def needs_transfer(self) -> bool:
        return any(self.receive)

    @property
    def pending(self) -> bool:
        return self.state is LoadState.PENDING

    @property
    def tier_pending(self) -> bool:
        return self.tier_state is LoadState.PENDING

    @property
    def settled(self) -> bool:
        return (
            not self.pending and not self.tier_pending and not any(w.pending for w in self.waits_on)
        )

    @property
    def ok(self) -> bool:
        done = LoadState.DONE
        return (
            self.state is done
            and self.tier_state is done
            and all(w.state is done for w in self.waits_on)
        )

    def received_blocks(self) -> list[int]:
        """Blocks received per group, from P or through a shared transfer (cache-probe)."""
        return [len(r) + len(a) for r, a in zip(self.receive, self.attached, strict=True)]

    def transfer_pairs(
        self, prefill_held: list[list[tuple[int, int]]]
    ) -> list[list[tuple[int, int]]]:
        """Per group, `(P block id, D block id)` pairs: P's held list and D's receive list
        come from the same plan, so they pair by block index."""
        pairs = []
        for group, wanted in enumerate(self.receive):
            p_ids = dict(prefill_held[group])
            missing = [k for k, _ in wanted if k not in p_ids]
            if missing:
                raise ValueError(f"prefill engine does not hold group {group} blocks {missing[:4]}")
            pairs.append([(p_ids[k], d_block) for k, d_block in wanted])
        return pairs
