"""Decode-side KV loads: reuse, shared in-flight transfers, publish on completion (design §7).

`DecodeLoads.begin(req, plan, hit, tier)` turns the P/D plan of a request into block tables on
D: per group, each block of `plan.held[g]` is either reused from D's own cache, attached to a
transfer that is already bringing the same block (a shared in-flight load), allocated fresh
and listed in `load.from_tier` for D's KV tier to fill (docs/tier.md: a shared store holds
what a prefill engine put), or allocated fresh and listed in `load.receive` for the
transport to fill from P: P is asked only for what D cannot find itself.

`DecodeLoads` is given what it works on (the pool, the group rules, the stats, the retention)
and nothing else; the `KVCacheManager` drives it as part of the request lifecycle
(`receive`, `load_finished`, `release`) and releases blocks itself.

Safety rules (§7):
* received blocks get hashes only in `finish(load, ok=True)`: a sibling can never hit KV that
  is still in flight; attaching to an in-flight block is waiting, not hitting;
* a failed load publishes nothing; every request attached to it fails with it, and all their
  blocks return to the pool when the engine releases them (unhashed, so as scratch);
* a request released while its own transfer is in flight keeps its blocks until the transfer
  has settled (the transport may still be writing into them); `finish` then reports it as
  abandoned and the manager releases the blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from itertools import repeat

import numpy as np

import relaykv.kvcache.accel as accel
from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.lookup import LocalHit
from relaykv.kvcache.pd_plan import PDPlan
from relaykv.kvcache.pool import NULL_BLOCK, BlockPool
from relaykv.kvcache.request import CacheRequest, KVLoad, LoadState
from relaykv.kvcache.retention import Retention
from relaykv.kvcache.stats import CacheStats

Publishing = Callable[[CacheRequest, int], AbstractContextManager[object]]


class DecodeLoads:
    """The decode engine's in-flight loads and the registry that lets them be shared."""

    def __init__(
        self,
        pool: BlockPool,
        rules: tuple[GroupRules, ...],
        stats: CacheStats,
        retention: Retention,
        hash_unit: int,
        publishing: Publishing | None = None,
    ) -> None:
        """`publishing(req, lowest_index)` names the request whose received blocks the pool
        is about to key (the manager's KV events carry their parent key and tokens)."""
        self.pool = pool
        self.publishing: Publishing = publishing or (lambda req, lowest: nullcontext())
        self.rules = rules
        self.stats = stats
        self.retention = retention
        self.hash_unit = hash_unit
        self.active: dict[int, KVLoad] = {}
        self.inflight: list[dict[bytes, tuple[KVLoad, int]]] = [{} for _ in rules]
        self._ids = itertools.count(1)

    # -- begin -----------------------------------------------------------------------
    def begin(
        self,
        req: CacheRequest,
        plan: PDPlan,
        hit: LocalHit | None,
        tier: Sequence[Mapping[int, int]] | None = None,
    ) -> KVLoad | None:
        """Plan and allocate the load of `req`'s prompt; None if the pool cannot hold it.

        `hit` is the request's local lookup under a common-resume policy, None under
        `per-group` (blocks are reused one by one by hash). `tier`: per group, block index ->
        tier slot of the held blocks D's KV tier can fill (what neither D's cache nor an
        in-flight transfer has comes from there before P is asked).
        """
        pool = self.pool
        junction = hit.junction if hit is not None else 0
        local, local_tokens = self.local_reuse(req, plan, hit)

        attached: list[dict[int, int]] = []
        wanted: list[list[int]] = []
        tiered: list[list[tuple[int, int]]] = []
        waits: set[KVLoad] = set()
        for rule in self.rules:
            g = rule.index
            keys = req.keys(g)
            inflight = self.inflight[g] if plan.coalesces_loads else {}
            in_tier = tier[g] if tier is not None else {}
            group_attached: dict[int, int] = {}
            group_wanted: list[int] = []
            group_tier: list[tuple[int, int]] = []
            for k in plan.held[g]:
                if k in local[g]:
                    continue
                entry = inflight.get(keys[k]) if k < len(keys) else None
                if entry is not None:
                    group_attached[k] = entry[1]
                    waits.add(entry[0])
                elif k in in_tier:
                    group_tier.append((k, in_tier[k]))
                else:
                    group_wanted.append(k)
            attached.append(group_attached)
            wanted.append(group_wanted)
            tiered.append(group_tier)

        idle_local = sum(1 for blocks in local for b in blocks.values() if pool.ref_cnt[b] == 0)
        fresh_needed = sum(len(w) for w in wanted) + sum(len(t) for t in tiered)
        if idle_local + fresh_needed > pool.num_free:
            return None

        receive: list[list[tuple[int, int]]] = []
        from_tier: list[list[tuple[int, int, int]]] = []
        for rule in self.rules:
            g = rule.index
            pool.touch(local[g].values())
            pool.touch(attached[g].values())
            fresh = pool.allocate(len(wanted[g]))
            receive.append(list(zip(wanted[g], fresh, strict=True)))
            filled = pool.allocate(len(tiered[g]))
            from_tier.append([(k, b, slot) for (k, slot), b in zip(tiered[g], filled, strict=True)])
            by_index = {**local[g], **attached[g], **dict(receive[g])}
            by_index.update((k, b) for k, b, _ in from_tier[g])
            held = plan.held[g]
            req.tables[g] = [NULL_BLOCK] * held.start + [by_index[k] for k in held]

        load = KVLoad(next(self._ids), req, plan, local, attached, receive, local_tokens, junction)
        load.from_tier = from_tier
        if any(from_tier):
            load.tier_state = LoadState.PENDING  # the manager starts the tier's job
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
            load.state = LoadState.DONE
        req.load = load
        self.active[load.load_id] = load
        self._record(load)
        if load.settled:
            self._deliver(load)
        return load

    def local_reuse(
        self, req: CacheRequest, plan: PDPlan, hit: LocalHit | None
    ) -> tuple[list[dict[int, int]], int]:
        """Per group the held blocks D reuses from its own cache (index -> block), and the
        prompt tokens that counts as local: the common hit under a common-resume policy
        (`hit`), else each block by key (`per-group`). Reads the cache, changes nothing."""
        if hit is not None:
            local = [
                {k: blocks[k] for k in plan.held[g] if k < len(blocks) and blocks[k] != NULL_BLOCK}
                for g, blocks in enumerate(hit.blocks)
            ]
            return local, hit.tokens
        local = [self._reusable(req, rule, plan.held[rule.index]) for rule in self.rules]
        return local, self._tokens_local_everywhere(local, req.num_prompt_tokens)

    def _reusable(self, req: CacheRequest, rule: GroupRules, held: range) -> dict[int, int]:
        return reusable_blocks(req, rule, self.pool.maps[rule.index], held)

    def _tokens_local_everywhere(self, local: list[dict[int, int]], n: int) -> int:
        indices = [np.fromiter(blocks, dtype=np.int64, count=len(blocks)) for blocks in local]
        return tokens_local_in(self.rules, self.hash_unit, indices, n)

    def _record(self, load: KVLoad) -> None:
        stats = self.stats
        stats.record_load(load.plan.num_tokens, load.local_tokens)
        if load.waits_on:
            stats.loads_coalesced += 1
        for rule in self.rules:
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
        """Record the end of `load`'s own transfer; returns the loads delivered now (`load`
        and loads that waited on it, unless abandoned). An abandoned `load` is dropped: the
        caller releases its request's blocks."""
        if not load.pending:
            raise RuntimeError(f"load {load.load_id} already finished ({load.state.value})")
        req = load.request
        for g, items in enumerate(load.receive):
            keys = req.keys(g)
            registry = self.inflight[g]
            for k, block in items:
                if k < len(keys) and registry.get(keys[k], (None, 0))[1] == block:
                    del registry[keys[k]]
        if ok:
            load.state = LoadState.DONE
            self._publish(load)
            self.stats.kv_bytes_received += sum(
                len(items) * rule.spec.page_bytes
                for rule, items in zip(self.rules, load.receive, strict=True)
            )
        else:
            load.state = LoadState.FAILED
            self.stats.loads_failed += 1
        if load.abandoned:
            self._drop(load)
        delivered = []
        for candidate in [load, *load.waiters]:
            if candidate.settled and not candidate.delivered and not candidate.abandoned:
                self._deliver(candidate)
                delivered.append(candidate)
        return delivered

    def tier_finished(self, load: KVLoad, ok: bool) -> list[KVLoad]:
        """D's KV tier ended `load`'s tier job: its blocks are keyed when it succeeded.
        Returns `[load]` when that delivered it."""
        load.tier_state = LoadState.DONE if ok else LoadState.FAILED
        if ok:
            self._publish(load, [[(k, b) for k, b, _ in items] for items in load.from_tier])
            self.stats.kv_bytes_from_tier += sum(
                len(items) * rule.spec.page_bytes
                for rule, items in zip(self.rules, load.from_tier, strict=True)
            )
        else:
            self.stats.loads_failed += 1
        if load.settled and not load.delivered and not load.abandoned:
            self._deliver(load)
            return [load]
        return []

    def _deliver(self, load: KVLoad) -> None:
        load.delivered = True
        self._drop(load)
        load.request.load = None
        if load.ok:
            self._mark_cached(load)

    def _publish(self, load: KVLoad, filled: list[list[tuple[int, int]]] | None = None) -> None:
        """Key the blocks a transfer filled (`filled`, per group; default what P sent)."""
        req = load.request
        for rule in self.rules:
            items = (filled if filled is not None else load.receive)[rule.index]
            if not items:
                continue
            keys = req.keys(rule.index)
            mask = load.plan.cache_mask(rule, self.retention, load.junction)
            with self.publishing(req, min(k for k, _ in items)):
                self.pool.cache_blocks(
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
        for rule in self.rules:
            full = min(load.plan.num_tokens // rule.block_size, len(req.keys(rule.index)))
            req.num_cached_blocks[rule.index] = full
        req.junction = load.junction

    def _drop(self, load: KVLoad) -> None:
        self.active.pop(load.load_id, None)
        for owner in load.waits_on:
            if load in owner.waiters:
                owner.waiters.remove(load)

    # -- releases while in flight ----------------------------------------------------------
    def defer_release(self, req: CacheRequest) -> bool:
        """Detach `req` from its load; True if its blocks must stay until its own transfer
        ends (the manager releases them when `finish` reports the abandoned load)."""
        load = req.load
        if load is None:
            return False
        req.load = None
        if load.pending or load.tier_pending:
            load.abandoned = True
            return True
        self._drop(load)
        return False


def reusable_blocks(
    req: CacheRequest, rule: GroupRules, gmap: Mapping[bytes, int], held: range
) -> dict[int, int]:
    """Per-group reuse: each held block cached in `gmap` by key (§7 `per-group`), as
    index -> block id (`reused_indices` on `held_probes`)."""
    found, start, stop = held_probes(req, rule, gmap, held)
    reused = reused_indices(found, start, stop, rule.reuse_peek)
    return {int(k): int(found[k - start]) for k in reused}


def held_probes(
    req: CacheRequest, rule: GroupRules, gmap: Mapping[bytes, int], held: range
) -> tuple[np.ndarray, int, int]:
    """`(found, start, stop)` for `reused_indices`: what `gmap` holds for each block of
    `held` the prompt has (0: nothing), with one probe past `stop` under the peek."""
    keys = req.keys(rule.index)
    start, stop = held.start, min(held.stop, len(keys))
    if start >= stop:
        return np.zeros(0, dtype=np.int64), start, start
    window = keys[start : stop + 1 if rule.reuse_peek else stop]
    # One probe per block, driven from C (a router scores decode engines with this too).
    found = np.fromiter(map(gmap.get, window, repeat(0)), dtype=np.int64, count=len(window))
    return found, start, stop


def reused_indices(found: np.ndarray, start: int, stop: int, peek: int) -> np.ndarray:
    """The decode-side reuse rule: the block indices in `[start, stop)` reused, ascending.
    `found[i]` is what the cache holds for block `start + i` (nonzero: held), with one probe
    past `stop` under the peek where the prompt has that block: in a draft group under the
    EAGLE drop a block's draft KV depends on the token after it, so it is reused only when
    the next block is held too. Probes come from an engine's map (`held_probes`) or, in a
    router, from its holders bitmask (`relaykv.router.holders`, docs/routing.md "Cost")."""
    n = max(0, stop - start)
    held = np.asarray(found[:n]) != 0
    if peek:
        proven = np.zeros(n, dtype=bool)
        nxt = np.asarray(found[1 : n + 1]) != 0
        proven[: len(nxt)] = nxt
        held &= proven
    return start + np.flatnonzero(held)


def reused_in_masks(masks: np.ndarray, slot: int, start: int, stop: int, peek: int) -> np.ndarray:
    """`reused_indices` where the probes are bit `slot` of a uint64 bitmask per block (a
    router's map of which engines hold each key, relaykv.router.holders): one C pass where the
    accelerator is built, else `reused_in_masks_py`. 0 <= start, stop <= len(masks)."""
    native = getattr(accel.native, "slot_reused", None)  # None: not built, or built before it
    if native is None:
        return reused_in_masks_py(masks, slot, start, stop, peek)
    data = native(np.ascontiguousarray(masks, dtype=np.uint64), slot, start, stop, peek)
    return np.frombuffer(data, dtype=np.int64)


def reused_in_masks_py(
    masks: np.ndarray, slot: int, start: int, stop: int, peek: int
) -> np.ndarray:
    """`reused_in_masks` in numpy: the slot's bits as the probes of `reused_indices` (the
    reference the C pass is tested against)."""
    if not 0 <= slot < 64 or start < 0 or stop > len(masks):
        raise ValueError("slot_reused: 0 <= slot < 64, 0 <= start and stop <= len(masks)")
    found = (masks[start : stop + 1 if peek else stop] >> np.uint64(slot)) & np.uint64(1)
    return reused_indices(found, start, stop, peek)


def local_groups(rules: Sequence[GroupRules]) -> list[GroupRules]:
    """The groups whose reuse `tokens_local_in` counts: the prefix-closed (full) ones, or
    every group where none is."""
    return [r for r in rules if r.prefix_closed] or list(rules)


def tokens_local_in(
    rules: Sequence[GroupRules], unit: int, local: Sequence[np.ndarray], n: int
) -> int:
    """Prompt tokens whose KV is reused locally in every prefix-closed (full) group (all
    groups if none: `local_groups`), from each group's reused block indices
    (`reused_indices`; the other groups' entries are not read): hash unit j counts when
    every such group reuses the block holding token j*unit; at most n - 1."""
    units = n // unit
    if units <= 0:
        return 0
    groups = [(rule.block_size, local[rule.index]) for rule in local_groups(rules)]
    return min(units_covered(unit, units, groups) * unit, n - 1)


def units_covered(unit: int, units: int, groups: Sequence[tuple[int, np.ndarray]]) -> int:
    """How many of hash units 0..units-1 (of `unit` tokens) start in a reused block of every
    group of `groups` (block size, reused block indices): `tokens_local_in`'s count, in one C
    pass where the accelerator is built, else `units_covered_py`."""
    native = getattr(accel.native, "units_covered", None)  # None: not built, or built before it
    if native is None:
        return units_covered_py(unit, units, groups)
    arrays = [(size, np.ascontiguousarray(indices, dtype=np.int64)) for size, indices in groups]
    count: int = native(unit, units, arrays)
    return count


def units_covered_py(unit: int, units: int, groups: Sequence[tuple[int, np.ndarray]]) -> int:
    """`units_covered` in numpy (the reference the C pass is tested against)."""
    covered: np.ndarray | None = None
    for block_size, local in groups:
        num_blocks = (units - 1) * unit // block_size + 1  # the blocks units start in
        reused = np.zeros(num_blocks, dtype=bool)
        indices = np.asarray(local, dtype=np.int64)
        reused[indices[(indices >= 0) & (indices < num_blocks)]] = True
        per_block, rest = divmod(block_size, unit)
        if rest:  # a block of no whole number of units: the block of each unit's start
            in_units = reused[np.arange(units, dtype=np.int64) * unit // block_size]
        elif per_block == 1:
            in_units = reused
        else:  # unit j starts in block j // per_block
            in_units = np.repeat(reused, per_block)[:units]
        covered = in_units if covered is None else covered & in_units
    return units if covered is None else int(np.count_nonzero(covered))
