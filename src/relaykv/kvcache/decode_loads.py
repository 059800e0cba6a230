"""Decode-side KV loads: reuse, shared in-flight transfers, publish on completion (KVCACHE.md §7).

`DecodeLoads.begin(req)` turns the P/D plan of a request into block tables on D: per group,
each block of `plan.held[g]` is either reused from D's own cache, attached to a transfer that
is already bringing the same block (a shared in-flight load), or allocated fresh and listed in
`load.receive` for the transport to fill from P.

Safety rules (§7):
* received blocks get hashes only in `finish(load, ok=True)`: a sibling can never hit KV that
  is still in flight; attaching to an in-flight block is waiting, not hitting;
* a failed load publishes nothing; every request attached to it fails with it, and all their
  blocks return to the pool when the engine frees them (unhashed, so as scratch);
* a request freed while its own transfer is in flight keeps its blocks until the transfer has
  settled (the transport may still be writing into them), then releases them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relaykv.kvcache.groups import FullAttentionGroup, GroupRules
from relaykv.kvcache.pd_plan import PDPlan, pd_plan
from relaykv.kvcache.pool import NULL_BLOCK
from relaykv.kvcache.request import CacheRequest

if TYPE_CHECKING:
    from relaykv.kvcache.manager import KVCacheManager


@dataclass(eq=False, slots=True)
class KVLoad:
    """One request's load of its prompt's KV from a prefill engine."""

    load_id: int
    request: CacheRequest
    plan: PDPlan
    local: list[dict[int, int]]  # per group: block index -> reused local block
    attached: list[dict[int, int]]  # per group: block index -> block another load brings
    receive: list[list[tuple[int, int]]]  # per group: (block index, D block id) to fill
    local_tokens: int
    junction: int = 0
    own_state: str = "pending"  # pending | done | failed (this load's own transfer)
    waits_on: set[KVLoad] = field(default_factory=set)
    waiters: list[KVLoad] = field(default_factory=list)
    abandoned: bool = False
    emitted: bool = False

    @property
    def needs_transfer(self) -> bool:
        return any(self.receive)

    @property
    def settled(self) -> bool:
        return self.own_state != "pending" and all(w.own_state != "pending" for w in self.waits_on)

    @property
    def ok(self) -> bool:
        return self.own_state == "done" and all(w.own_state == "done" for w in self.waits_on)

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


class DecodeLoads:
    """The decode engine's in-flight loads and the registry that lets them be shared."""

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.active: dict[int, KVLoad] = {}
        self.inflight: list[dict[bytes, tuple[KVLoad, int]]] = [{} for _ in manager.geometry.groups]
        self._ids = itertools.count(1)

    # -- begin -----------------------------------------------------------------------
    def begin(self, req: CacheRequest) -> KVLoad | None:
        """Plan and allocate the load of `req`'s prompt; None if the pool cannot hold it."""
        m = self.manager
        pool = m.pool
        n = req.num_prompt_tokens
        plan = pd_plan(m.geometry, m.pd_policy, n)
        junction = 0
        if plan.common_resume:
            hit = m.lookup(req)
            junction = hit.junction
            local = [
                {k: blocks[k] for k in plan.held[g] if k < len(blocks) and blocks[k] != NULL_BLOCK}
                for g, blocks in enumerate(hit.blocks)
            ]
            local_tokens = hit.tokens
        else:
            local = [self._reusable(req, rule, plan.held[rule.index]) for rule in m.rules]
            local_tokens = self._tokens_local_everywhere(local, n)

        attached: list[dict[int, int]] = []
        wanted: list[list[int]] = []
        waits: set[KVLoad] = set()
        for rule in m.rules:
            g = rule.index
            keys = req.keys(g)
            inflight = self.inflight[g] if plan.coalesces_loads else {}
            group_attached: dict[int, int] = {}
            group_wanted: list[int] = []
            for k in plan.held[g]:
                if k in local[g]:
                    continue
                entry = inflight.get(keys[k]) if k < len(keys) else None
                if entry is not None:
                    group_attached[k] = entry[1]
                    waits.add(entry[0])
                else:
                    group_wanted.append(k)
            attached.append(group_attached)
            wanted.append(group_wanted)

        idle_local = sum(1 for blocks in local for b in blocks.values() if pool.ref_cnt[b] == 0)
        if idle_local + sum(len(w) for w in wanted) > pool.num_free:
            return None

        receive: list[list[tuple[int, int]]] = []
        for rule in m.rules:
            g = rule.index
            pool.touch(local[g].values())
            pool.touch(attached[g].values())
            fresh = pool.allocate(len(wanted[g]))
            receive.append(list(zip(wanted[g], fresh, strict=True)))
            by_index = {**local[g], **attached[g], **dict(receive[g])}
            held = plan.held[g]
            req.tables[g] = [NULL_BLOCK] * held.start + [by_index[k] for k in held]

        load = KVLoad(next(self._ids), req, plan, local, attached, receive, local_tokens, junction)
        load.waits_on = waits
        for owner in waits:
            owner.waiters.append(load)
        if plan.coalesces_loads:
            for g, items in enumerate(receive):
                keys = req.keys(g)
                for k, block in items:
                    if k < len(keys):
                        self.inflight[g][keys[k]] = (load, block)
        if not load.needs_transfer:
            load.own_state = "done"
        req.load = load
        self.active[load.load_id] = load
        self._record(load)
        return load

    def _reusable(self, req: CacheRequest, rule: GroupRules, held: range) -> dict[int, int]:
        return reusable_blocks(req, rule, self.manager.pool.maps[rule.index], held)

    def _tokens_local_everywhere(self, local: list[dict[int, int]], n: int) -> int:
        m = self.manager
        return tokens_local_everywhere(m.rules, m.geometry.hash_unit, local, n)

    def _record(self, load: KVLoad) -> None:
        m = self.manager
        stats = m.stats
        stats.record_load(load.plan.num_tokens, load.local_tokens)
        if load.waits_on:
            stats.loads_coalesced += 1
        for rule in m.rules:
            g = rule.index
            b = rule.block_size
            stats.record_group_reuse(
                g,
                len(load.local[g]) * b,
                (len(load.receive[g]) + len(load.attached[g])) * b,
                rule.spec.page_bytes,
                b,
            )

    # -- finish ----------------------------------------------------------------------
    def finish(self, load: KVLoad, ok: bool) -> list[KVLoad]:
        """Record the end of `load`'s own transfer; returns the loads now settled."""
        if load.own_state != "pending":
            raise RuntimeError(f"load {load.load_id} already finished ({load.own_state})")
        m = self.manager
        req = load.request
        for g, items in enumerate(load.receive):
            keys = req.keys(g)
            registry = self.inflight[g]
            for k, block in items:
                if k < len(keys) and registry.get(keys[k], (None, 0))[1] == block:
                    del registry[keys[k]]
        if ok:
            load.own_state = "done"
            self._publish(load)
            m.stats.kv_bytes_received += sum(
                len(items) * rule.spec.page_bytes
                for rule, items in zip(m.rules, load.receive, strict=True)
            )
        else:
            load.own_state = "failed"
            m.stats.loads_failed += 1
        if load.abandoned:
            self._drop(load)
            m._release(req)
        settled = []
        for candidate in [load, *load.waiters]:
            if candidate.settled and not candidate.emitted and not candidate.abandoned:
                candidate.emitted = True
                self._drop(candidate)
                candidate.request.load = None
                if candidate.ok:
                    self._mark_cached(candidate)
                settled.append(candidate)
        return settled

    def settle_ready(self, load: KVLoad) -> bool:
        """True (once) if `load` needs no transfer and waits on nothing: usable at once."""
        if load.settled and not load.emitted:
            load.emitted = True
            self._drop(load)
            load.request.load = None
            self._mark_cached(load)
            return True
        return False

    def _publish(self, load: KVLoad) -> None:
        m = self.manager
        req = load.request
        for rule in m.rules:
            items = load.receive[rule.index]
            if not items:
                continue
            keys = req.keys(rule.index)
            mask = load.plan.cache_mask(rule, m.retention, load.junction)
            with m.publishing(req, min(k for k, _ in items)):
                m.pool.cache_blocks(
                    rule.index,
                    (
                        (block, keys[k])
                        for k, block in items
                        if k < len(keys) and (mask is None or k in mask)
                    ),
                )

    def _mark_cached(self, load: KVLoad) -> None:
        # The prompt's full blocks have all been considered for hashing; later `cache`
        # calls continue after them (decode tokens).
        req = load.request
        for rule in self.manager.rules:
            full = min(load.plan.num_tokens // rule.block_size, len(req.keys(rule.index)))
            req.num_cached_blocks[rule.index] = full
        req.junction = load.junction

    def _drop(self, load: KVLoad) -> None:
        self.active.pop(load.load_id, None)
        for owner in load.waits_on:
            if load in owner.waiters:
                owner.waiters.remove(load)

    # -- frees while in flight ----------------------------------------------------------
    def defer_free(self, req: CacheRequest) -> bool:
        """Called by `free`: True if the release must wait for the request's own transfer."""
        load = req.load
        assert isinstance(load, KVLoad)
        req.load = None
        if load.own_state == "pending":
            load.abandoned = True
            return True
        self._drop(load)
        return False


def reusable_blocks(
    req: CacheRequest, rule: GroupRules, gmap: Mapping[bytes, int], held: range
) -> dict[int, int]:
    """Per-group reuse: each held block D holds by hash (§7 `per-group`).

    In a draft group under the EAGLE drop a block's draft KV depends on the token after
    it, so it is reused only when the next block is held too (the peek, per block).
    """
    keys = req.keys(rule.index)
    start, stop = held.start, min(held.stop, len(keys))
    if start >= stop:
        return {}
    # map() runs the probes in C (a router scores every decode engine with this).
    found = map(gmap.get, keys[start:stop])
    if rule.peek:
        proven = map(gmap.__contains__, keys[start + 1 : stop + 1])  # one short at the end
        return {
            k: b for k, b, ok in zip(range(start, stop), found, proven, strict=False) if ok and b
        }
    return {k: b for k, b in zip(range(start, stop), found, strict=True) if b is not None}


def tokens_local_everywhere(
    rules: Sequence[GroupRules], unit: int, local: list[dict[int, int]], n: int
) -> int:
    """Prompt tokens whose KV is reused locally in every full group (all groups if none)."""
    full = [r for r in rules if isinstance(r, FullAttentionGroup)] or list(rules)
    units = n // unit
    if len(full) == 1:
        # One group: block k covers units [k*ratio, (k+1)*ratio); count those below `units`.
        ratio = full[0].block_size // unit
        local_k = local[full[0].index]
        if not local_k:
            return 0
        if (max(local_k) + 1) * ratio <= units:
            return min(len(local_k) * ratio * unit, n - 1)
        count = sum(min(ratio, units - k * ratio) for k in local_k if k * ratio < units)
        return min(count * unit, n - 1)
    count = 0
    for j in range(units):
        p = j * unit
        if all(p // r.block_size in local[r.index] for r in full):
            count += unit
    return min(count, n - 1)
