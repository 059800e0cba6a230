"""The cache manager: one engine's blocks and the lifecycle of its requests (docs/design.md §10).

One `KVCacheManager` per engine owns the block pool, the per-group rules and the cache state
of every live request. It is the implementation of `CacheLifecycle` (base.py: the calls a
driver may make, and in which order); the scheduler, the simulator and `relaykv cache-probe`
type against that contract. Everything below the lifecycle (the lookup of §5, allocation
and the admission gate of §8, hashing and window frees of §6) is private to this class.

Safety rules: block tables are written only here; a block is hashed only once its KV is
written (`commit` takes processed token counts, never scheduled ones); releases are tail
first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from relaykv.kvcache.base import Admission
from relaykv.kvcache.decode_loads import DecodeLoads, reusable_blocks
from relaykv.kvcache.events import KVEventSource
from relaykv.kvcache.geometry import Geometry, cdiv
from relaykv.kvcache.groups import rules_for
from relaykv.kvcache.lookup import LocalHit, find_longest_hit, longest_hit_tokens
from relaykv.kvcache.pd_config import DEFAULT_PD_POLICY, PDPolicy, eagle_reuse_conflict
from relaykv.kvcache.pd_plan import PDPlan, pd_plan, prefill_hit_cap, reach_blocks
from relaykv.kvcache.pool import NULL_BLOCK, BlockPool, EventSink, KVEvent
from relaykv.kvcache.request import CacheRequest, CacheRole, KVLoad
from relaykv.kvcache.retention import Retention, hash_mask, parse_retention, replay_boundaries
from relaykv.kvcache.sizing import CacheSizing
from relaykv.kvcache.stats import CacheStats
from relaykv.kvcache.tier.backend import TierBackend
from relaykv.kvcache.tier.jobs import TierCopy
from relaykv.kvcache.tier.lookup import Present, find_tiered_hit
from relaykv.kvcache.tier.offload import KVTier
from relaykv.kvcache.tier.plan import parse_interval


class KVCacheManager:
    def __init__(
        self,
        geometry: Geometry,
        num_blocks: int,
        *,
        retention: str | Retention = "boundaries",
        pd_policy: PDPolicy | str = DEFAULT_PD_POLICY,
        enable_caching: bool = True,
        max_model_len: int = 1 << 20,
        max_in_flight_tokens: int = 8192,
        pd_role: bool = False,
        on_event: EventSink | None = None,
        sizing: CacheSizing | None = None,
        sibling_reach: int = 0,
        tier: TierBackend | None = None,
        tier_interval: int | None = None,
    ) -> None:
        """`sizing`: the engine's `CacheSizing`, built and checked once at startup (then
        `max_model_len`, `max_in_flight_tokens` and `pd_role` come from it; build it with
        the same `sibling_reach`). `sibling_reach`: the P/D plan's sibling reach in tokens
        (`pd_plan`; both engines of a pair use the same). `tier`: a KV tier below the pool
        (docs/tier.md), checkpointed every `tier_interval` tokens."""
        if sibling_reach < 0:
            raise ValueError(f"sibling_reach must be >= 0 tokens, got {sibling_reach}")
        self.sibling_reach = sibling_reach
        self.geometry = geometry
        self.rules = rules_for(geometry)
        self.retention = (
            retention
            if isinstance(retention, Retention)
            else parse_retention(retention, geometry.alignment)
        )
        self.pd_policy = PDPolicy.parse(pd_policy)
        self.pool = BlockPool(num_blocks, geometry.num_groups, enable_caching)
        self.events = KVEventSource(self.pool, self.rules)
        self.events.set_sink(on_event)
        if sizing is None:
            sizing = CacheSizing.build(
                geometry,
                num_blocks,
                max_model_len,
                max_in_flight_tokens,
                self.pd_policy if pd_role else None,
                sibling_reach,
            )
        elif sizing.geometry != geometry or sizing.num_blocks != num_blocks:
            raise ValueError("the cache sizing was built for another geometry or pool")
        self.sizing = sizing
        self.stats = CacheStats(geometry.num_groups)
        self.requests: dict[str, CacheRequest] = {}
        self.loads = DecodeLoads(
            self.pool,
            self.rules,
            self.stats,
            self.retention,
            geometry.hash_unit,
            self.events.publishing,
        )
        self.tier: KVTier | None = None
        self._abandoned: set[str] = set()  # released while their tier load flies
        self._tier_loads: dict[int, KVLoad] = {}  # tier job id -> the P/D load it fills
        self._tier_delivered: list[KVLoad] = []
        if tier is not None:
            interval = parse_interval(tier_interval, geometry.alignment, self.retention)
            medium = tier.medium
            self.tier = KVTier(
                self.rules,
                tier,
                interval,
                lambda kind, group, keys: self.events.emit(
                    KVEvent(kind, group, keys, medium=medium)
                ),
            )

    def set_event_sink(self, sink: EventSink | None) -> None:
        """Send the pool's KV events to `sink` (docs/kv-events.md)."""
        self.events.set_sink(sink)

    # -- the lifecycle --------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: Sequence[int] | np.ndarray,
        salt: str | bytes | None = None,
        role: CacheRole = CacheRole.COLOCATED,
        *,
        recompute: bool = False,
    ) -> CacheRequest:
        """Open a request. `recompute`: its prompt was already counted in the stats (a failed
        load computed here after all), so its admission counts as a re-admission."""
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} is already known to the cache")
        if len(prompt) == 0:
            raise ValueError("a request needs at least one prompt token")
        req = CacheRequest(request_id, prompt, self.rules, self.geometry.hash_unit, salt, role)
        req.num_admissions = int(recompute)
        self.requests[request_id] = req
        return req

    def admit(
        self,
        req: CacheRequest,
        budget: int,
        *,
        lookahead: int = 0,
        must_fit: int | None = None,
        hit: LocalHit | None = None,
        cap: int | None = None,
        external: int = 0,
        keep_free: int = 0,
    ) -> Admission | None:
        """Look `req` up (§5) and give it blocks for its hit plus up to `budget` tokens
        (+ `lookahead` slots when that reaches its last token). With `must_fit`, admit only if
        that many tokens could fit under the per-request caps (§8). None changes nothing:
        the pool cannot hold it now. Records the hit in the stats (a re-admission after a
        preemption counts as such).

        `hit`: what `lookup(req, cap)` returned just before (a driver that asks first);
        taken as is while no key left the pool since (`BlockPool.key_epoch`), else `req` is
        looked up again under `cap` (the lookup's resume cap). `external`: the tokens after
        the hit that a KV connector writes (a driver's external prefix cache), not computed
        here: they get blocks, and the window blocks below them are freed at once (§6: no
        position computed here reads them); they are keyed, like computed ones, once
        `commit` says they are written. `keep_free`: blocks the driver reserves for others
        (the admission leaves at least that many free)."""
        if hit is None or hit.epoch != self.pool.key_epoch or self.tier is not None:
            hit = self._lookup(req, tiered=True, cap=cap)
        if external < 0 or hit.tokens + external > req.num_tokens:
            raise ValueError(f"request {req.request_id}: {external} external tokens do not fit")
        recomputed = self._recomputed(hit)
        if external and recomputed:
            raise ValueError(
                f"request {req.request_id}: external tokens cannot follow a hit whose last "
                "position is computed again (eagle_reuse=recompute)"
            )
        start = hit.tokens - recomputed + external
        n = min(req.num_tokens - start, budget)
        extra = lookahead if start + n == req.num_tokens else 0
        if not self._allocate(
            req, start + n, hit=hit, lookahead=extra, must_fit=must_fit, keep_free=keep_free
        ):
            return None
        if external:
            self._free_skipped(req, start)
        readmitted = req.num_admissions > 0
        req.num_admissions += 1
        from_tier = 0
        if hit.num_tier_blocks:
            assert self.tier is not None
            self.tier.start_load(req, hit)
            from_tier = hit.tokens - longest_hit_tokens(req, self.rules, self.pool, self._cap(req))
        if recomputed:
            # After the tier's load was planned on the hit's own blocks (it fills the sources).
            self._private_tails(req, hit.tokens)
            from_tier = min(from_tier, hit.tokens - recomputed)
        self.stats.record_local(req.num_tokens, hit.tokens - recomputed, readmitted, from_tier)
        if not readmitted:
            # Per group, the prompt KV the hit reused (the relaykv:group_prefix_* counters,
            # §9): only real blocks count, not the nulls below a window.
            for rule in self.rules:
                b = rule.block_size
                reused = sum(1 for block in hit.blocks[rule.index] if block) * b
                self.stats.record_group_reuse(rule.index, reused, 0, rule.spec.page_bytes, b)
        return Admission(hit, n, from_tier, recomputed)

    def _recomputed(self, hit: LocalHit) -> int:
        """Positions below the hit computed again: 1 under `eagle_reuse=recompute` (§4)."""
        return self.rules[0].tail if hit.tokens > 0 else 0

    def _private_tails(self, req: CacheRequest, hit_tokens: int) -> None:
        """`eagle_reuse=recompute` (§4): the block holding position `hit_tokens - 1` becomes a
        private copy in every group, so computing that position again (the draft's KV there
        depends on this request's next token) never writes a shared block. The request keeps
        holding the source until the step that copies it is committed."""
        for rule in self.rules:
            table = req.tables[rule.index]
            i = hit_tokens // rule.block_size - 1
            (private,) = self.pool.allocate(1)
            req.copies.append((rule.index, table[i], private))
            table[i] = private

    def reserve(self, req: CacheRequest, num_tokens: int, lookahead: int = 0) -> bool:
        """Blocks for positions `[0, num_tokens + lookahead)` of an admitted request; False
        (nothing changed) when the pool is short: the caller preempts and retries."""
        return self._allocate(req, num_tokens, lookahead=lookahead)

    def commit(self, req: CacheRequest, processed: int, new_tokens: Iterable[int] = ()) -> None:
        """After a step: append the sampled tokens, hash the blocks whose KV is now written
        for positions `[0, processed)` and free what no later position reads (§6)."""
        if new_tokens:
            req.append_tokens(new_tokens)
        if req.copies:  # the step that copied them has run (§4 recompute)
            self.pool.free([source for _, source, _ in reversed(req.copies)])
            req.copies = []
        self._cache(req, processed)
        if self.tier is not None and self.pool.enable_caching:
            points = (*self._boundaries(req), req.junction)
            self.tier.offload(req, processed, self.pool, points)
        self._free_skipped(req, processed)

    def tier_poll(self) -> list[tuple[CacheRequest, bool]]:
        """Apply the KV tier's finished jobs (docs/tier.md); returns the requests whose tier
        load ended, with success. Loaded: the blocks are keyed and the request resumes at its
        hit. Failed: its blocks are released (it stays open, like a preempted request) and
        the tier forgets those keys, so its next admission computes them."""
        if self.tier is None:
            return []
        ended: list[tuple[CacheRequest, bool]] = []
        for req, job, ok in self.tier.poll(self.pool):
            load = self._tier_loads.pop(job.job_id, None)
            if load is not None:  # the tier's part of a P/D load
                for settled in self.loads.tier_finished(load, ok):
                    self._delivered(settled)
                    self._tier_delivered.append(settled)
                if load.abandoned and not load.pending:
                    self._release(load.request)
                continue
            if req.request_id in self._abandoned:
                self._abandoned.discard(req.request_id)
                self._release(req)
                continue
            if ok:
                by_group: dict[int, list[tuple[int, bytes]]] = {}
                for c in job.copies:
                    by_group.setdefault(c.group, []).append((c.block, c.key))
                with self.events.publishing(req, 0):
                    for group, pairs in by_group.items():
                        self.pool.cache_blocks(group, pairs)
            else:
                self._release(req, forget=False)
            ended.append((req, ok))
        return ended

    def tier_delivered(self) -> list[KVLoad]:
        """P/D loads the last `tier_poll` delivered (their tier job ended last), each once."""
        out, self._tier_delivered = self._tier_delivered, []
        return out

    def receive(self, req: CacheRequest) -> KVLoad | None:
        """Decode side: plan the load of `req`'s prompt from a prefill engine (§7). None
        changes nothing: the pool cannot hold it now. The transport fills `load.receive`
        (pair it with P's blocks through `load.transfer_pairs`) unless `load.delivered`."""
        plan = self._plan(req)
        self._check_load_policy(plan)
        tiered = self.tier is not None and self.pool.enable_caching
        hit = self._lookup(req, tiered=tiered) if plan.common_resume else None
        in_tier = self._tier_reuse(req, plan, hit) if tiered else None
        load = self.loads.begin(req, plan, hit, in_tier)
        if load is not None:
            req.num_admissions += 1
            if any(load.from_tier):
                assert self.tier is not None
                copies = [
                    TierCopy(g, req.keys(g)[k], slot, block)
                    for g, items in enumerate(load.from_tier)
                    for k, block, slot in items
                ]
                job = self.tier.start_copies(req, copies)
                self._tier_loads[job.job_id] = load
            if load.delivered:
                self._delivered(load)
        return load

    def _check_load_policy(self, plan: PDPlan) -> None:
        """A load under `eagle_reuse=recompute` needs `per-group` (`eagle_reuse_conflict`)."""
        if self.geometry.eagle and (
            conflict := eagle_reuse_conflict(plan.policy, self.geometry.eagle_reuse)
        ):
            raise ValueError(conflict)

    def _tier_reuse(
        self, req: CacheRequest, plan: PDPlan, hit: LocalHit | None
    ) -> list[dict[int, int]]:
        """Per group, block index -> tier slot of the held blocks D's tier can fill: the
        tiered hit's tier blocks (common resume), else each held block the pool lacks and
        the tier holds, by key, under the same reuse rule as the pool's (`per-group`)."""
        tier = self.tier
        assert tier is not None
        if hit is not None:
            return [
                {k: slot for k, slot in hit.tier[g] if k in plan.held[g]} if hit.tier else {}
                for g in range(len(self.rules))
            ]
        cap = req.num_prompt_tokens - 1
        tier.discover(req, self.pool, cap, (*self._boundaries(req), req.junction))
        out: list[dict[int, int]] = []
        for rule in self.rules:
            g = rule.index
            keys = req.keys(g)
            device, tier_map = self.pool.maps[g], tier.index.maps[g]
            reused = reusable_blocks(req, rule, Present(device, tier_map), plan.held[g])
            out.append({k: tier_map[keys[k]] for k in reused if keys[k] not in device})
        return out

    def load_finished(self, load: KVLoad, ok: bool) -> list[KVLoad]:
        """The transport ended `load`'s own transfer. Returns the loads delivered now (each
        with its request's `load` cleared); a load whose request was released meanwhile
        releases its blocks here."""
        delivered = self.loads.finish(load, ok)
        if load.abandoned and not load.tier_pending:
            self._release(load.request)
        for settled in delivered:
            self._delivered(settled)
        return delivered

    def _delivered(self, load: KVLoad) -> None:
        if load.ok:
            # The full-prompt rule: D recomputes N-1, so it has processed N-1 tokens (§7).
            self._free_skipped(load.request, load.request.num_prompt_tokens - 1)

    def release(self, req: CacheRequest) -> None:
        """Release all of a request's blocks, tail first (§3), and forget it. Deferred while
        its own transfer is in flight (`load_finished` completes it)."""
        if self.loads.defer_release(req):
            return
        if self.tier is not None and req.request_id in self.tier.loading:
            self._abandoned.add(req.request_id)  # `tier_poll` releases it when the load ends
            return
        self._release(req)

    def preempt(self, req: CacheRequest, *, detach: bool = False) -> list[int]:
        """Release a running request's blocks for recompute; it stays registered, with its
        tokens and hashes, so re-admission starts with a lookup of its own prefix.

        `detach`: a step still in flight may write the blocks. They leave the request but
        stay held (its keyed blocks can still be hit) and are returned, tail first; the
        caller hands them to `free_detached` once that step is processed."""
        if req.load is not None or (self.tier is not None and req.request_id in self.tier.loading):
            raise RuntimeError(f"request {req.request_id} cannot be preempted while loading")
        return self._release(req, forget=False, detach=detach)

    def free_detached(self, blocks: Sequence[int]) -> None:
        """Return the blocks `preempt(detach=True)` handed out (in the order it gave)."""
        self.pool.free(blocks)

    # -- observing the cache ----------------------------------------------------------------
    def lookup(self, req: CacheRequest, cap: int | None = None) -> LocalHit:
        """The local hit `admit` would take for `req` now (§5); changes no block. For a
        driver whose scheduler asks before it allocates (the vLLM plugin): it hands the hit
        to `admit`. `cap`: resume no later than this token (the hit stays aligned)."""
        hit = self._lookup(req, cap=cap)
        hit.epoch = self.pool.key_epoch
        return hit

    def receive_local_tokens(self, req: CacheRequest) -> int:
        """The local tokens `receive` would reuse for `req` now (§7, `KVLoad.local_tokens`);
        changes no block."""
        plan = pd_plan(self.geometry, self.pd_policy, req.num_prompt_tokens)
        self._check_load_policy(plan)
        hit = self._lookup(req) if plan.common_resume else None
        return self.loads.local_reuse(req, plan, hit)[1]

    def usage(self) -> float:
        """The fraction of the pool's usable blocks held by requests."""
        return self.pool.usage()

    def check(self) -> list[str]:
        """Violations of the invariants (`invariants.check_manager`); empty: consistent."""
        # Imported here: invariants.py reads this class's internals (it imports manager.py).
        from relaykv.kvcache.invariants import check_manager

        return check_manager(self)

    # -- lookup and allocation (private: drivers use the lifecycle) --------------------
    def _lookup(
        self, req: CacheRequest, tiered: bool = False, cap: int | None = None
    ) -> LocalHit:
        """The exact local hit of a request that holds no blocks yet (§5), resuming at most
        at `cap`; `tiered`: over the pool and the tier (docs/tier.md), with the blocks to
        load in `hit.tier`."""
        if not self.pool.enable_caching:
            return LocalHit(0, [[] for _ in self.rules])
        limit = req.num_tokens - 1 if cap is None else min(cap, req.num_tokens - 1)
        if req.role is CacheRole.PREFILL and self.sibling_reach:
            # The sibling reach's extra window blocks, when P still has them cached, are
            # attached rather than recomputed (`_attach_reach`); else the reach caps the hit.
            plain = min(limit, prefill_hit_cap(self.geometry, self.rules, self.pd_policy, req))
            reached = self._attach_reach(req, find_longest_hit(req, self.rules, self.pool, plain))
            if reached is not None:
                req.junction = reached.junction
                return reached
        cap = min(limit, self._cap(req))
        if tiered and self.tier is not None:
            # A shared tier first adopts what other engines stored of this prompt.
            self.tier.discover(req, self.pool, cap, (*self._boundaries(req), req.junction))
            hit = find_tiered_hit(req, self.rules, self.pool, self.tier.index, cap)
        else:
            hit = find_longest_hit(req, self.rules, self.pool, cap)
        req.junction = hit.junction
        return hit

    def _cap(self, req: CacheRequest) -> int:
        """The largest resume point a lookup of `req` may return."""
        cap = req.num_tokens - 1
        if req.role is CacheRole.PREFILL:
            cap = min(cap, self._prefill_hit_cap(req))
        return cap

    def _attach_reach(self, req: CacheRequest, hit: LocalHit) -> LocalHit | None:
        """`hit` with the blocks the P/D plan holds below its windows (the sibling reach)
        taken from the cache, or None when one of them is not cached: a prefill request
        must end up holding every planned block (§7)."""
        plan = self._plan(req)
        blocks = []
        for rule in self.rules:
            table = list(hit.blocks[rule.index])
            keys = req.keys(rule.index)
            cached = self.pool.maps[rule.index]
            for k in reach_blocks(plan, rule, hit.tokens):
                block = cached.get(keys[k])
                if block is None:
                    return None
                table[k] = block
            blocks.append(table)
        return LocalHit(hit.tokens, blocks, hit.junction)

    def _prefill_hit_cap(self, req: CacheRequest) -> int:
        return prefill_hit_cap(self.geometry, self.rules, self.pd_policy, req, self.sibling_reach)

    def _plan(self, req: CacheRequest) -> PDPlan:
        return pd_plan(self.geometry, self.pd_policy, req.num_prompt_tokens, self.sibling_reach)

    def _blocks_needed(
        self, req: CacheRequest, num_tokens: int, hit: LocalHit | None = None
    ) -> int:
        """Free blocks an `_allocate(req, num_tokens, hit)` would consume (touched idle hits
        count: touching takes them out of the free queue)."""
        needed = 0
        for rule in self.rules:
            table = req.tables[rule.index]
            have = len(table)
            if hit is not None and not table:
                hit_blocks = hit.blocks[rule.index]
                have = len(hit_blocks)
                needed += sum(1 for b in hit_blocks if b and self.pool.ref_cnt[b] == 0)
                if hit.tier:
                    needed += len(hit.tier[rule.index])  # fresh blocks the tier fills
                needed += self._recomputed(hit)  # the private copy of its last block (§4)
            needed += max(0, cdiv(num_tokens, rule.block_size) - have)
        return needed

    def _can_fit(self, req: CacheRequest, num_tokens: int, hit: LocalHit | None = None) -> bool:
        """The admission gate of §8: blocks for `num_tokens` capped per group must fit."""
        return self.blocks_to_fit(req, num_tokens, hit) <= self.pool.num_free

    def blocks_to_fit(self, req: CacheRequest, num_tokens: int, hit: LocalHit | None = None) -> int:
        """Free blocks `req` still needs to hold `num_tokens` tokens at once, capped per group
        (§8: a window holds at most its cap); `hit`: blocks it would take first. Read-only:
        for a driver that reserves room for requests in flight (vLLM's async loads)."""
        needed = 0
        for rule, cap in zip(self.rules, self.sizing.caps, strict=True):
            table = req.tables[rule.index]
            have = sum(1 for b in table if b)
            if hit is not None and not table:
                have = sum(1 for b in hit.blocks[rule.index] if b and self.pool.ref_cnt[b] > 0)
            needed += max(0, min(cap, cdiv(num_tokens, rule.block_size)) - have)
        return needed

    def _allocate(
        self,
        req: CacheRequest,
        num_tokens: int,
        hit: LocalHit | None = None,
        lookahead: int = 0,
        must_fit: int | None = None,
        keep_free: int = 0,
    ) -> bool:
        """Make the tables cover positions `[0, num_tokens + lookahead)`.

        On the first allocation `hit` (from `_lookup`) is taken: its blocks are touched. With
        `must_fit`, the request is admitted only if that many tokens could fit (§8). Returns
        False, changing nothing, when the pool cannot provide the blocks.
        """
        total = num_tokens + lookahead
        if must_fit is not None and not self._can_fit(req, must_fit, hit):
            return False
        if self._blocks_needed(req, total, hit) + keep_free > self.pool.num_free:
            return False
        if hit is not None and not any(req.tables):
            for rule in self.rules:
                blocks = hit.blocks[rule.index]
                self.pool.touch(blocks)
                req.tables[rule.index] = list(blocks)
                req.num_cached_blocks[rule.index] = len(blocks)
            # Blocks loaded from the tier: fresh (allocated once every group's hit blocks are
            # taken, so none is evicted for them), keyed once the load is done.
            for g, loads in enumerate(hit.tier):
                table = req.tables[g]
                for (i, _), block in zip(loads, self.pool.allocate(len(loads)), strict=True):
                    table[i] = block
        for rule in self.rules:
            table = req.tables[rule.index]
            missing = cdiv(total, rule.block_size) - len(table)
            if missing > 0:
                table.extend(self.pool.allocate(missing))
        return True

    # -- caching and frees (private) -----------------------------------------------------
    def _cache(self, req: CacheRequest, num_tokens: int) -> None:
        """Hash the full blocks whose KV is written for positions `[0, num_tokens)` (§2, §6)."""
        if not self.pool.enable_caching:
            return
        upto = min(num_tokens, req.num_tokens)
        for rule in self.rules:
            g = rule.index
            keys = req.keys(g)
            table = req.tables[g]
            end = min(upto // rule.block_size, len(keys), len(table))
            start = req.num_cached_blocks[g]
            if end <= start:
                continue
            mask = None
            horizon = rule.hash_horizon(upto)
            if horizon is not None:
                # Blocks are hashed once, when they fill (`num_cached_blocks` moves past them),
                # so the mask must already name the windows of points a little beyond `upto`
                # (chunked prefill, §6): every point up to the rule's hash horizon.
                mask = hash_mask(rule, self.retention, self._boundaries(req), req.junction, horizon)
            with self.events.publishing(req, start):
                self.pool.cache_blocks(
                    g,
                    ((table[k], keys[k]) for k in range(start, end) if mask is None or k in mask),
                )
            req.num_cached_blocks[g] = end

    def _boundaries(self, req: CacheRequest) -> tuple[int, ...]:
        return replay_boundaries(self.geometry, req.num_prompt_tokens, self.rules)

    def _free_skipped(self, req: CacheRequest, processed: int) -> None:
        """Free blocks no future computation of `req` reads (§6, processed basis)."""
        floor = None
        if req.role is CacheRole.PREFILL:
            plan = self._plan(req)
        for rule in self.rules:
            if rule.prefix_closed:
                continue
            if req.role is CacheRole.PREFILL:
                floor = plan.held[rule.index].start * rule.block_size
            table = req.tables[rule.index]
            first_kept = min(rule.first_kept_block(processed, floor), len(table))
            dead = []
            # Walk back from the boundary; everything below the first null is already free.
            for i in range(first_kept - 1, -1, -1):
                block = table[i]
                if block == NULL_BLOCK:
                    break
                dead.append(block)
                table[i] = NULL_BLOCK
            if dead:
                self.pool.free(dead)  # deepest first: evicted before its parents (§3)

    def _release(self, req: CacheRequest, forget: bool = True, detach: bool = False) -> list[int]:
        blocks: list[int] = []
        for table in req.tables:
            blocks.extend(b for b in reversed(table) if b)
            table.clear()
        blocks.extend(source for _, source, _ in reversed(req.copies))
        req.copies = []
        req.num_cached_blocks = [0] * len(self.rules)
        if not detach:
            self.pool.free(blocks)
        if forget:
            self.requests.pop(req.request_id, None)
            if self.tier is not None:
                self.tier.forget(req)
        return blocks

    # -- prefill side of P/D ---------------------------------------------------------------
    def hold_for_transfer(self, req: CacheRequest) -> list[list[tuple[int, int]]]:
        """Keep exactly the blocks the P/D plan names (§7) and free the rest.

        Returns per group the `(block index, block id)` pairs the decode engine may read.
        The request stays registered until `free(req)` (after D read them or a lease expired).
        """
        plan = self._plan(req)
        self._cache(req, req.num_prompt_tokens)
        held: list[list[tuple[int, int]]] = []
        extra: list[int] = []
        for rule in self.rules:
            table = req.tables[rule.index]
            keep = plan.held[rule.index]
            for i in range(len(table) - 1, -1, -1):
                if table[i] and i not in keep:
                    extra.append(table[i])
                    table[i] = NULL_BLOCK
            del table[keep.stop :]  # lookahead slots past the prompt are not sent
            missing = [i for i in keep if i >= len(table) or table[i] == NULL_BLOCK]
            if missing:
                raise RuntimeError(
                    f"request {req.request_id}: group {rule.index} "
                    f"lacks planned blocks {missing[:4]}"
                )
            held.append([(i, table[i]) for i in keep])
        self.pool.free(extra)
        return held


__all__ = ["Admission", "KVCacheManager", "prefill_hit_cap"]
