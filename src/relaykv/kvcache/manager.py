"""The scheduler-facing cache manager: lookup, allocation, caching, frees (KVCACHE.md §3-§8).

One `KVCacheManager` per engine owns the block pool, the per-group rules and the cache state
of every live request. The scheduler calls it in this order for a request computed here:

    req = add_request(id, prompt, salt)
    hit = lookup(req)                       # exact hybrid hit (§5), touches nothing
    allocate(req, n, hit=hit, must_fit=N)   # touches the hit, allocates up to n (+ lookahead)
    ... after each step:  cache(req, processed); free_skipped(req, processed)
    free(req)

A prefill engine (`CacheRole.PREFILL`) finishes with `hold_for_transfer(req)` and frees after
the decode engine has read the blocks. A decode engine receives KV through `loads`
(`relaykv.kvcache.decode_loads`). Safety rules: block tables are written only here; a block is
hashed only once its KV is written (the scheduler passes processed token counts, never
scheduled ones); frees are tail first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from relaykv.kvcache.decode_loads import DecodeLoads
from relaykv.kvcache.geometry import Geometry, cdiv
from relaykv.kvcache.groups import GroupRules, SlidingWindowGroup, rules_for
from relaykv.kvcache.lookup import LocalHit, find_longest_hit
from relaykv.kvcache.pd_plan import PD_POLICIES, pd_plan
from relaykv.kvcache.pool import NULL_BLOCK, BlockPool, EventSink, KVEvent
from relaykv.kvcache.request import CacheRequest, CacheRole
from relaykv.kvcache.retention import Retention, parse_retention, replay_boundaries, sliding_mask
from relaykv.kvcache.sizing import CacheSizing
from relaykv.kvcache.stats import CacheStats


class KVCacheManager:
    def __init__(
        self,
        geometry: Geometry,
        num_blocks: int,
        *,
        retention: str | Retention = "boundaries",
        pd_policy: str = "per-group",
        enable_caching: bool = True,
        max_model_len: int = 1 << 20,
        max_in_flight_tokens: int = 8192,
        pd_role: bool = False,
        on_event: EventSink | None = None,
    ) -> None:
        if pd_policy not in PD_POLICIES:
            raise ValueError(
                f"unknown P/D policy {pd_policy!r}; choose from {', '.join(PD_POLICIES)}"
            )
        self.geometry = geometry
        self.rules = rules_for(geometry)
        self.retention = (
            retention
            if isinstance(retention, Retention)
            else parse_retention(retention, geometry.alignment)
        )
        self.pd_policy = pd_policy
        self.pool = BlockPool(num_blocks, geometry.num_groups, enable_caching)
        self._event_sink: EventSink | None = None
        self._event_source: tuple[CacheRequest, int] | None = None  # (request, lowest index)
        self.set_event_sink(on_event)
        self.sizing = CacheSizing.build(
            geometry,
            num_blocks,
            max_model_len,
            max_in_flight_tokens,
            pd_policy if pd_role else None,
        )
        self.stats = CacheStats(geometry.num_groups)
        self.requests: dict[str, CacheRequest] = {}
        self.loads = DecodeLoads(self)

    # -- KV events (docs/kv-events.md) ------------------------------------------------
    def set_event_sink(self, sink: EventSink | None) -> None:
        """Send the pool's events to `sink`; stored ones carry parent key and token ids."""
        self._event_sink = sink
        self.pool.on_event = None if sink is None else self._emit

    def publishing(self, req: CacheRequest, lowest_index: int) -> _EventSource:
        """Name the request whose blocks (from `lowest_index` on) the pool is about to store."""
        return _EventSource(self, req, lowest_index)

    def _emit(self, event: KVEvent) -> None:
        source = self._event_source
        if event.kind == "stored" and source is not None:
            req, lo = source
            table = req.tables[event.group]
            wanted = set(event.block_ids)
            where = {b: k for k, b in enumerate(table[lo:], lo) if b in wanted}
            ks = [where[b] for b in event.block_ids if b in where]
            if len(ks) == len(event.block_ids):
                size = self.rules[event.group].block_size
                tokens = req.tokens
                token_ids = tuple(t for k in ks for t in tokens[k * size : (k + 1) * size])
                keys = req.keys(event.group)
                parent = keys[ks[0] - 1] if ks[0] > 0 else None
                event = KVEvent(
                    "stored", event.group, event.keys, event.block_ids, parent, token_ids
                )
        assert self._event_sink is not None
        self._event_sink(event)

    # -- requests ------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: Sequence[int] | np.ndarray,
        salt: str | bytes | None = None,
        role: CacheRole = CacheRole.COLOCATED,
    ) -> CacheRequest:
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} is already known to the cache")
        if len(prompt) == 0:
            raise ValueError("a request needs at least one prompt token")
        req = CacheRequest(request_id, prompt, self.rules, self.geometry.hash_unit, salt, role)
        self.requests[request_id] = req
        return req

    def append_tokens(self, req: CacheRequest, token_ids: Iterable[int]) -> None:
        req.append_tokens(token_ids)

    # -- lookup and allocation ------------------------------------------------------
    def lookup(self, req: CacheRequest) -> LocalHit:
        """The exact local hit of a request that holds no blocks yet (§5)."""
        if not self.pool.enable_caching:
            return LocalHit(0, [[] for _ in self.rules])
        cap = req.num_tokens - 1
        if req.role is CacheRole.PREFILL:
            cap = min(cap, self._prefill_hit_cap(req))
        hit = find_longest_hit(req, self.rules, self.pool, cap)
        req.junction = hit.junction
        return hit

    def _prefill_hit_cap(self, req: CacheRequest) -> int:
        return prefill_hit_cap(self.geometry, self.rules, self.pd_policy, req)

    def blocks_needed(self, req: CacheRequest, num_tokens: int, hit: LocalHit | None = None) -> int:
        """Free blocks an `allocate(req, num_tokens, hit)` would consume (touched idle hits
        count: touching takes them out of the free queue)."""
        needed = 0
        for rule in self.rules:
            table = req.tables[rule.index]
            have = len(table)
            if hit is not None and not table:
                hit_blocks = hit.blocks[rule.index]
                have = len(hit_blocks)
                needed += sum(1 for b in hit_blocks if b and self.pool.ref_cnt[b] == 0)
            needed += max(0, cdiv(num_tokens, rule.block_size) - have)
        return needed

    def can_fit(self, req: CacheRequest, num_tokens: int, hit: LocalHit | None = None) -> bool:
        """The admission gate of §8: blocks for `num_tokens` capped per group must fit."""
        needed = 0
        for rule, cap in zip(self.rules, self.sizing.caps, strict=True):
            table = req.tables[rule.index]
            have = sum(1 for b in table if b)
            if hit is not None and not table:
                have = sum(1 for b in hit.blocks[rule.index] if b and self.pool.ref_cnt[b] > 0)
            needed += max(0, min(cap, cdiv(num_tokens, rule.block_size)) - have)
        return needed <= self.pool.num_free

    def allocate(
        self,
        req: CacheRequest,
        num_tokens: int,
        hit: LocalHit | None = None,
        lookahead: int = 0,
        must_fit: int | None = None,
    ) -> bool:
        """Make the tables cover positions `[0, num_tokens + lookahead)`.

        On the first allocation `hit` (from `lookup`) is taken: its blocks are touched. With
        `must_fit`, the request is admitted only if that many tokens could fit (§8). Returns
        False, changing nothing, when the pool cannot provide the blocks.
        """
        total = num_tokens + lookahead
        if must_fit is not None and not self.can_fit(req, must_fit, hit):
            return False
        if self.blocks_needed(req, total, hit) > self.pool.num_free:
            return False
        if hit is not None and not any(req.tables):
            for rule in self.rules:
                blocks = hit.blocks[rule.index]
                self.pool.touch(blocks)
                req.tables[rule.index] = list(blocks)
                req.num_cached_blocks[rule.index] = len(blocks)
        for rule in self.rules:
            table = req.tables[rule.index]
            missing = cdiv(total, rule.block_size) - len(table)
            if missing > 0:
                table.extend(self.pool.allocate(missing))
        return True

    # -- caching and frees ---------------------------------------------------------------
    def cache(self, req: CacheRequest, num_tokens: int) -> None:
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
            if isinstance(rule, SlidingWindowGroup):
                # Blocks are hashed once, when they fill (`num_cached_blocks` moves past them),
                # so the mask must already name the windows of points a little beyond `upto`:
                # under chunked prefill the window of a replay boundary r > upto starts below
                # upto (§6). Any window reaching below `end` belongs to r < upto + W + b(1+peek).
                horizon = upto + rule.window + rule.block_size * (1 + rule.peek)
                mask = sliding_mask(
                    rule, self.retention, self.boundaries(req), req.junction, horizon
                )
            with self.publishing(req, start):
                self.pool.cache_blocks(
                    g,
                    ((table[k], keys[k]) for k in range(start, end) if mask is None or k in mask),
                )
            req.num_cached_blocks[g] = end

    def boundaries(self, req: CacheRequest) -> tuple[int, ...]:
        return replay_boundaries(self.geometry, req.num_prompt_tokens, self.rules)

    def free_skipped(self, req: CacheRequest, processed: int) -> None:
        """Free sliding blocks no future computation of `req` reads (§6, processed basis)."""
        floor = None
        if req.role is CacheRole.PREFILL:
            plan = pd_plan(self.geometry, self.pd_policy, req.num_prompt_tokens)
        for rule in self.rules:
            if not isinstance(rule, SlidingWindowGroup):
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

    def free(self, req: CacheRequest) -> None:
        """Release all of a request's blocks, tail first (§3). Deferred while its load flies."""
        if req.load is not None and self.loads.defer_free(req):
            return
        self._release(req)

    def preempt(self, req: CacheRequest) -> None:
        """Release a running request's blocks for recompute; it stays registered, with its
        tokens and hashes, so re-admission starts with a lookup of its own prefix."""
        if req.load is not None:
            raise RuntimeError(f"request {req.request_id} cannot be preempted while loading")
        self._release(req, forget=False)

    def _release(self, req: CacheRequest, forget: bool = True) -> None:
        blocks: list[int] = []
        for table in req.tables:
            blocks.extend(b for b in reversed(table) if b)
            table.clear()
        req.num_cached_blocks = [0] * len(self.rules)
        self.pool.free(blocks)
        if forget:
            self.requests.pop(req.request_id, None)

    # -- prefill side of P/D ---------------------------------------------------------------
    def hold_for_transfer(self, req: CacheRequest) -> list[list[tuple[int, int]]]:
        """Keep exactly the blocks the P/D plan names (§7) and free the rest.

        Returns per group the `(block index, block id)` pairs the decode engine may read.
        The request stays registered until `free(req)` (after D read them or a lease expired).
        """
        plan = pd_plan(self.geometry, self.pd_policy, req.num_prompt_tokens)
        self.cache(req, req.num_prompt_tokens)
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


def prefill_hit_cap(
    geometry: Geometry, rules: tuple[GroupRules, ...], pd_policy: str, req: CacheRequest
) -> int:
    """The largest local hit a prefill engine may take (also what a router scores it by)."""
    # A prefill engine must end up holding every block its P/D plan names; blocks below
    # a local hit's window are nulls, so the hit may not start above the plan's floor.
    plan = pd_plan(geometry, pd_policy, req.num_prompt_tokens)
    cap = req.num_tokens
    for rule in rules:
        if isinstance(rule, SlidingWindowGroup):
            first = plan.held[rule.index].start
            cap = min(cap, (first + 1) * rule.block_size + rule.window - 2)
    return cap


class _EventSource:
    """Context in which the pool's stored events belong to one request (see `_emit`)."""

    __slots__ = ("lowest", "manager", "req")

    def __init__(self, manager: KVCacheManager, req: CacheRequest, lowest: int) -> None:
        self.manager, self.req, self.lowest = manager, req, lowest

    def __enter__(self) -> None:
        self.manager._event_source = (self.req, self.lowest)

    def __exit__(self, *exc: object) -> None:
        self.manager._event_source = None
