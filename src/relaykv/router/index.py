"""What one engine holds, rebuilt from its KV events, and the usable hit there (docs/routing.md).

An `EngineIndex` keeps, per KV group, the set of block keys the engine can serve, fed by the
engine's vLLM-format KV event batches (docs/kv-events.md) in sequence order. It exposes them
as `maps` (key -> 1), the shape kvcache's lookup reads, so the router's "usable hit" is
computed by the very code the engine runs (kvcache's `find_longest_hit` resume point, as
`longest_hit_tokens`, with the prefill cap for a prefill engine; the P/D plan's local reuse
for a decode engine), never re-implemented.

Sequence rules (`accept`):
* the first batch seen after `reset()` may start anywhere; a caller that wants the full state
  asks for a replay from 0 (`needs_replay`);
* a batch whose number is below the next expected one is a duplicate (a replay overlapping
  the live stream) and is ignored;
* a batch above the next expected one is a gap: `accept` refuses it and the caller replays
  from `expected`, or, when the publisher no longer has those batches, calls `reset()` so the
  index holds only what later events prove (it may miss blocks, never invent them).

Memory: one dict entry per held block and group (the key's bytes object plus a slot),
measured by `benchmarks/bench_router.py`.

A KV tier (docs/tier.md): events whose `medium` is not the device's ("CPU") feed `tier`, a
second set of maps. Blocks there are reachable at a cost (copied back before the request
computes), so a colocated or prefill engine's usable hit counts the tokens the tier adds
beyond the device hit at `TIER_WEIGHT` each; the hit itself is kvcache's tiered lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from relaykv.common.messages.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockStored,
    decode_batch,
)
from relaykv.kvcache import (
    DEFAULT_PD_POLICY,
    CacheRequest,
    CacheRole,
    Geometry,
    PDPlan,
    PDPolicy,
    pd_plan,
    rules_for,
)
from relaykv.kvcache.decode_loads import (
    held_probes,
    local_groups,
    reused_indices,
    tokens_local_in,
)
from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.hashing import PrefixChains
from relaykv.kvcache.lookup import MatchedRun, longest_hit_tokens
from relaykv.kvcache.manager import prefill_hit_cap
from relaykv.kvcache.pd_plan import reach_blocks
from relaykv.kvcache.tier import TieredKeys
from relaykv.router.holders import KeyHolders, PromptCounts

_HELD = 1  # the index does not know block ids; lookups only test membership
_NO_BLOCKS = np.zeros(0, dtype=np.int64)  # a group whose reuse is not counted
_BOUND_STRIDE = 32  # blocks between the probes of `hit_bound`
# A token the engine would load from its KV tier is worth this much of one held on the device
# (a copy back before the request computes, still far cheaper than computing it).
TIER_WEIGHT = 0.8


@dataclass(eq=False)
class TierHeld:
    """The blocks an engine's KV tier holds, per group (its non-device KV events)."""

    maps: list[dict[bytes, int]]

    @property
    def num_blocks(self) -> int:
        return sum(map(len, self.maps))


@dataclass(eq=False)
class EngineIndex:
    """The blocks one engine holds, per group, and the sequence bookkeeping of its events."""

    geometry: Geometry
    role: str = "colocated"  # prefill | decode | colocated: how the hit is scored
    pd_policy: PDPolicy = DEFAULT_PD_POLICY
    maps: list[dict[bytes, int]] = field(default_factory=list)
    expected: int | None = None  # next sequence number; None until the first batch
    batches: int = 0
    gaps: int = 0
    resets: int = 0
    events_dropped: int = 0  # malformed batches or events for unknown groups
    holders: KeyHolders | None = None  # the router's key map shared by its role's engines
    slot: int | None = None  # this engine's bit in `holders`
    sibling_reach: int = 0  # the P/D plan's sibling reach (its /v1/kv_cache_info)

    def __post_init__(self) -> None:
        self.pd_policy = PDPolicy.parse(self.pd_policy)  # the engine's /v1/kv_cache_info string
        self.rules: tuple[GroupRules, ...] = rules_for(self.geometry)
        self._full = tuple(r for r in self.rules if r.prefix_closed)  # the full groups
        self._counted = frozenset(r.index for r in local_groups(self.rules))
        if not self.maps:
            self.maps = [{} for _ in self.geometry.groups]
        self.tier = TierHeld([{} for _ in self.geometry.groups])
        self._caps: dict[tuple[int, int, int], int] = {}  # `_prefill_cap`'s recent answers
        self._plans: dict[tuple[int, int], PDPlan] = {}  # `_plan`'s recent answers
        if self.holders is not None and self.slot is None:
            self.slot = self.holders.slot()

    def close(self) -> None:
        """Forget everything and give the holders slot back (the engine left the router)."""
        self._clear()
        if self.holders is not None and self.slot is not None:
            self.holders.release(self.slot)
            self.slot = None

    def _clear(self) -> None:
        if self.holders is not None and self.slot is not None:
            for group, gmap in enumerate(self.maps):
                self.holders.discard(group, gmap, self.slot)
        for gmap in self.maps:
            gmap.clear()

    # -- feeding ---------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return sum(map(len, self.maps))

    def reset(self) -> None:
        """Forget everything (engine restarted, disconnected, or an unrecoverable gap)."""
        self._clear()
        for tmap in self.tier.maps:
            tmap.clear()
        self.expected = None
        self.resets += 1

    def accept(self, seq: int, payload: bytes) -> bool:
        """Apply batch `seq` if it is the next one (see module docstring); False on a gap."""
        if self.expected is not None:
            if seq < self.expected:
                return True  # duplicate
            if seq > self.expected:
                self.gaps += 1
                return False
        self.apply(payload)
        self.expected = seq + 1
        return True

    def apply(self, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError:
            self.events_dropped += 1
            return
        self.batches += 1
        num_groups = len(self.maps)
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                self._clear()
                continue
            group = ev.group_idx if ev.group_idx is not None else 0
            if not 0 <= group < num_groups:
                self.events_dropped += 1
                continue
            keys = [h for h in ev.block_hashes if isinstance(h, bytes)]
            if ev.medium not in (None, MEDIUM_GPU):
                tmap = self.tier.maps[group]
                if isinstance(ev, BlockStored):
                    tmap.update(dict.fromkeys(keys, _HELD))
                else:
                    for h in keys:
                        tmap.pop(h, None)
                continue
            gmap = self.maps[group]
            if isinstance(ev, BlockStored):
                for h in keys:
                    gmap[h] = _HELD
                if self.holders is not None and self.slot is not None:
                    self.holders.add(group, keys, self.slot)
            else:
                for h in keys:
                    gmap.pop(h, None)
                if self.holders is not None and self.slot is not None:
                    self.holders.discard(group, keys, self.slot)

    # -- scoring -----------------------------------------------------------------------
    def usable_hit(
        self, req: CacheRequest, counts: Callable[[int], PromptCounts] | None = None
    ) -> int:
        """Prompt tokens this engine would reuse for `req` (kvcache's own rules). `counts`
        (a decode engine's): the prompt's keys in the router's shared holders map, which
        give this engine's probes of those groups without probing its maps again."""
        if not req.num_tokens:
            return 0
        matched = self._matched(counts)
        if self.role == "decode":
            n = req.num_prompt_tokens
            plan = self._plan(n)
            if plan.common_resume:
                return longest_hit_tokens(req, self.rules, self, matched=matched)
            # only the groups `tokens_local_in` reads (the full ones) are probed
            local = [
                self._local(req, rule, plan.held[rule.index], counts)
                if rule.index in self._counted
                else _NO_BLOCKS
                for rule in self.rules
            ]
            return tokens_local_in(self.rules, self.geometry.hash_unit, local, n)
        cap = None
        if self.role == "prefill":
            if self.sibling_reach:  # the reach's blocks, when held, are attached (kvcache)
                reach_cap = self._prefill_cap(req, False)
                hit = longest_hit_tokens(req, self.rules, self, reach_cap, matched)
                plan = self._plan(req.num_prompt_tokens)
                if all(
                    req.keys(rule.index)[k] in self.maps[rule.index]
                    for rule in self.rules
                    for k in reach_blocks(plan, rule, hit)
                ):
                    return hit
            cap = self._prefill_cap(req)
        device = longest_hit_tokens(req, self.rules, self, cap, matched)
        if not self.tier.num_blocks:
            return device
        tiered = longest_hit_tokens(req, self.rules, TieredKeys(self, self.tier), cap)
        return device + int(TIER_WEIGHT * (tiered - device))

    def _plan(self, n: int) -> PDPlan:
        """kvcache's P/D plan for an `n`-token prompt on this engine (the last few are kept:
        a decision asks for it per engine, and kvcache's own cache hashes the geometry)."""
        key = (n, self.sibling_reach)
        plan = self._plans.get(key)
        if plan is None or plan.policy is not self.pd_policy:
            if len(self._plans) >= 4:
                self._plans.clear()
            plan = self._plans[key] = pd_plan(self.geometry, self.pd_policy, n, key[1])
        return plan

    def _prefill_cap(self, req: CacheRequest, reach: bool = True) -> int:
        """The prefill engine's hit cap; `reach=False`: without the sibling reach's blocks
        (the engine attaches them when cached), an upper bound of what it may take. It
        depends on the request only through its lengths: the last few are kept (a decision
        asks for a request's cap up to three times)."""
        reach_tokens = self.sibling_reach if reach else 0
        key = (req.num_prompt_tokens, req.num_tokens, reach_tokens)
        cap = self._caps.get(key)
        if cap is None:
            if len(self._caps) >= 4:
                self._caps.clear()
            cap = self._caps[key] = prefill_hit_cap(
                self.geometry, self.rules, self.pd_policy, req, reach_tokens
            )
        return cap

    def local_hit(
        self, req: CacheRequest, counts: Callable[[int], PromptCounts] | None = None
    ) -> int:
        """Prompt tokens this engine would reuse computing `req` itself, as a colocated
        engine does (kvcache's hybrid lookup, every group at one resume point): on a decode
        engine, the hit of a local request (conditional disaggregation, docs/routing.md)."""
        if not req.num_tokens:
            return 0
        return longest_hit_tokens(req, self.rules, self, matched=self._matched(counts))

    def _matched(self, counts: Callable[[int], PromptCounts] | None) -> MatchedRun | None:
        """kvcache's full-group runs from block 0 on this engine's device maps, read from the
        prompt's holders counts (one pass shared by the role's engines) when at hand."""
        slot = self.slot
        if counts is None or slot is None:
            return None
        return lambda rule, limit: counts(rule.index).run(slot, limit)

    def _local(
        self,
        req: CacheRequest,
        rule: GroupRules,
        held: range,
        counts: Callable[[int], PromptCounts] | None,
    ) -> np.ndarray:
        """The block indices of `held` this engine reuses (kvcache's per-group rule), probed
        in the holders map when the prompt's counts of this group are at hand (the full
        groups, after `hit_bound`), else in the engine's own map."""
        if counts is None or self.slot is None or not rule.prefix_closed:
            return reused_indices(
                *held_probes(req, rule, self.maps[rule.index], held), rule.reuse_peek
            )
        stop = min(held.stop, len(req.keys(rule.index)))
        if held.start >= stop:
            return np.zeros(0, dtype=np.int64)
        return counts(rule.index).reused(self.slot, held.start, stop, rule.reuse_peek)

    def resume_cap(self, req: CacheRequest) -> int:
        """The largest resume point this engine may use for `req` (the prefill cap on a
        prefill engine, §7)."""
        cap = req.num_prompt_tokens - 1
        if self.role == "prefill":
            cap = min(cap, self._prefill_cap(req, reach=False))
        return max(0, cap)

    def hit_bound(
        self, req: CacheRequest, counts: Callable[[int], PromptCounts] | None = None
    ) -> int:
        """A cheap upper bound of `usable_hit(req)`: in each full group, the run kvcache's
        lookup would match from block 0 (read from the role's holders pass when `counts` is
        given and no KV tier is involved, else bounded by the first missing block among one
        probed per stride); for a `per-group` decode engine, the count of blocks held in the
        full groups. A router evaluates the exact hit only where this bound can still win
        (docs/routing.md "Cost")."""
        n = req.num_prompt_tokens
        if n <= 1:
            return 0
        full = self._full
        if self.role == "decode" and not self._plan(n).common_resume:
            bound = n - 1
            for rule in full or self.rules:  # reuse needs a block local in every such group
                if counts is not None and self.slot is not None:
                    held = counts(rule.index).held(self.slot)  # shared with other engines
                else:
                    held = sum(map(self.maps[rule.index].__contains__, req.keys(rule.index)))
                bound = min(bound, held * rule.block_size)
            return bound
        cap = n - 1
        if self.role == "prefill":
            cap = min(cap, self._prefill_cap(req, reach=False))
        bound = cap
        slot = self.slot
        tiered = any(self.tier.maps)  # a KV tier holds blocks
        if counts is not None and slot is not None and not tiered:
            # The exact runs, from the role's shared holders pass (a run ends within the
            # prompt's keys, so it needs no cap at their count).
            for rule in full:
                run = counts(rule.index).run(slot, cap // rule.block_size + rule.peek)
                bound = min(bound, rule.hit_from_matched(run, cap))
            return max(0, bound)
        keyed = TieredKeys(self, self.tier) if tiered else self
        matched = None if tiered else self._matched(counts)
        for rule in full:
            keys, gmap = req.keys(rule.index), keyed.maps[rule.index]
            limit = min(cap // rule.block_size + rule.peek, len(keys))
            if matched is not None:  # the exact run, from the role's shared holders pass
                run = matched(rule, limit)
            else:
                # The exact run of held blocks from block 0 ends at or before the first
                # missing block; probing one block in _BOUND_STRIDE finds one within a
                # stride of it.
                run = max(0, limit)
                for k in range(min(_BOUND_STRIDE, run) - 1, run, _BOUND_STRIDE) if run else ():
                    if keys[k] not in gmap:
                        run = k
                        break
            bound = min(bound, rule.hit_from_matched(run, cap))
        return max(0, bound)

    def request(
        self,
        tokens: Sequence[int],
        salt: str | None = None,
        request_id: str = "route",
        chains: PrefixChains | None = None,
        token_bytes: bytes | None = None,
    ) -> CacheRequest:
        """A cache request with this engine's hashing (share it among equal geometries);
        `chains` memoises the hashes of prefixes recent prompts shared; `token_bytes`:
        `tokens` as little-endian int32 bytes, where the caller has them."""
        role = CacheRole.PREFILL if self.role == "prefill" else CacheRole.COLOCATED
        return CacheRequest(
            request_id,
            tokens,
            self.rules,
            self.geometry.hash_unit,
            salt,
            role,
            chains,
            token_bytes=token_bytes,
        )
