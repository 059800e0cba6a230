"""One engine's tier, driven by its cache manager (docs/tier.md).

`KVTier` turns the cache's events into tier jobs and back:

* `offload(req, upto, ...)` after the manager keyed a request's written blocks: every
  offload boundary r that became ready (`TierPlan.ready_at(r) <= upto`) is added to the index
  as a checkpoint under the request's previous one; the blocks the tier lacks go out in one
  store job. Their device blocks are held (one reference each) until the job is reported,
  so a block the pool frees meanwhile is never overwritten under the copy. With a shared
  tier, a decode engine stores only what it computed: the prompt's checkpoints are its
  prefill engine's, which keeps them in its own part of the store (put by the decode engine
  they would go when it goes), so the decode engine's checkpoints hang under the last one of
  the prompt that it adopted from the store, and without one it stores none.
* `start_load(req, hit)` after the manager gave a tiered hit fresh blocks: one load job, the
  slots pinned; the request waits (the scheduler's loading queue) until `poll` reports it.
* `poll(pool)` applies what the backend finished: stores become visible (and their device
  blocks are let go), loads hand their request back with success; a failed load's keys are
  dropped from the index so the retry computes.
* `discover(req, pool, cap)` before a lookup, for a shared tier only: the blocks of the
  prompt that neither the pool nor the index holds are probed in the store, and every
  complete checkpoint among them is adopted into the index (as if stored here), so the
  lookup can hit what another engine stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.lookup import LocalHit
from relaykv.kvcache.pool import NULL_BLOCK, BlockPool
from relaykv.kvcache.request import CacheRequest, CacheRole
from relaykv.kvcache.tier.backend import SharedTierBackend, TierBackend
from relaykv.kvcache.tier.index import TierEventSink, TierIndex
from relaykv.kvcache.tier.jobs import JobKind, TierCopy, TierJob
from relaykv.kvcache.tier.plan import TierPlan


@dataclass(slots=True)
class TierStats:
    """The tier's counters (docs/tier.md "Metrics")."""

    blocks_stored: int = 0
    blocks_loaded: int = 0
    store_jobs: int = 0
    load_jobs: int = 0
    stores_failed: int = 0
    loads_failed: int = 0
    checkpoints_skipped: int = 0  # a boundary the tier could not take (blocks gone, no room)
    blocks_adopted: int = 0  # a shared tier's blocks another engine (or a past life) stored
    resets: int = 0  # times a shared tier's index was forgotten (its store lost its contents)

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


NEVER = 1 << 62  # a chain's `after` once it stores nothing more


@dataclass(slots=True)
class _Chain:
    """How far a request's checkpoints got: boundaries up to `after` were considered; the
    last stored one sits at `parent_r` (node `parent`, None: no checkpoint yet). `rooted`:
    the chain hangs under a checkpoint another engine stored, and ends when that one goes."""

    after: int = 0
    parent_r: int = 0
    parent: bytes | None = None
    rooted: bool = False


class KVTier:
    def __init__(
        self,
        rules: tuple[GroupRules, ...],
        backend: TierBackend,
        interval: int | None = None,
        on_event: TierEventSink | None = None,
    ) -> None:
        self.rules = rules
        self.plan = TierPlan(rules, interval)
        self.backend = backend
        self.index = TierIndex(len(rules), backend.capacity_blocks, on_event)
        self.stats = TierStats()
        self._chains: dict[str, _Chain] = {}
        self._stores: dict[int, list[int]] = {}  # job id -> device blocks held
        self._loads: dict[int, CacheRequest] = {}  # job id -> the waiting request
        self.loading: dict[str, TierJob] = {}  # request id -> its load job
        self._next_job = 0
        self._shared = backend if isinstance(backend, SharedTierBackend) else None
        self._epoch = self._shared.epoch if self._shared is not None else 0

    # -- stores ----------------------------------------------------------------------------
    def offload(
        self, req: CacheRequest, upto: int, pool: BlockPool, extra: Iterable[int] = ()
    ) -> None:
        """Store the checkpoints of `req` that `upto` written tokens made ready."""
        chain = self._chains.get(req.request_id)
        if chain is None:
            chain = self._chains[req.request_id] = self._new_chain(req, extra)
        plan = self.plan
        points = plan.points(chain.after, upto, extra)
        if not points or plan.ready_at(points[0]) > upto:
            return
        keys = [req.keys(g) for g in range(len(self.rules))]
        copies: list[TierCopy] = []
        held: list[int] = []
        for r in points:
            if plan.ready_at(r) > upto:
                break
            if chain.parent is not None and chain.parent not in self.index.nodes:
                if chain.rooted:  # the prefill engine's checkpoint left the index
                    chain.after = NEVER
                    break
                chain.parent_r, chain.parent = 0, None  # evicted: the next one is a root
            items = plan.items(keys, r, chain.parent_r)
            if items is None:
                break  # a successor key needs a token not sampled yet: the next commit
            chain.after = r
            blocks = self._device_blocks(req, items, pool)
            if blocks is None:
                self.stats.checkpoints_skipped += 1
                continue
            node = plan.node_id(keys, r)
            new = self.index.add_node(node, r, chain.parent, items)
            if new is None:
                self.stats.checkpoints_skipped += 1
                continue
            for slot in new:
                block = blocks[slot.group][slot.index]
                copies.append(TierCopy(slot.group, slot.key, slot.slot, block))
                held.append(block)
            chain.parent_r, chain.parent = r, node
        if copies:
            pool.touch(held)
            self._submit(JobKind.STORE, copies, None)
            self._stores[self._next_job - 1] = held

    def _new_chain(self, req: CacheRequest, extra: Iterable[int]) -> _Chain:
        """A request's chain; a decode engine's on a shared tier hangs under the last
        checkpoint of its prompt that the index holds (its prefill engine's), or stores
        nothing."""
        if self._shared is None or req.role is not CacheRole.DECODE:
            return _Chain()
        keys = [req.keys(g) for g in range(len(self.rules))]
        prompt = req.num_prompt_tokens
        for r in reversed(self.plan.points(0, prompt, extra)):
            if any(need.stop > len(keys[g]) for g, need in enumerate(self.plan.covered(r))):
                continue  # a block it needs is not keyed yet: never a stored checkpoint
            node = self.plan.node_id(keys, r)
            if node in self.index.nodes:
                return _Chain(prompt, r, node, rooted=True)
        return _Chain(NEVER)

    def _device_blocks(
        self, req: CacheRequest, items: list[list[tuple[int, bytes]]], pool: BlockPool
    ) -> list[dict[int, int]] | None:
        """Per group, block index -> device block for the items the tier lacks (None: one is
        neither held by the request nor cached in the pool any more)."""
        out: list[dict[int, int]] = []
        for g, pairs in enumerate(items):
            table = req.tables[g]
            found: dict[int, int] = {}
            for i, key in pairs:
                if self.index.holds(g, key):
                    continue
                block = table[i] if i < len(table) else NULL_BLOCK
                if block == NULL_BLOCK or pool.block_key[block] not in (None, key):
                    block = pool.maps[g].get(key, NULL_BLOCK)
                if block == NULL_BLOCK:
                    return None
                found[i] = block
            out.append(found)
        return out

    # -- a shared tier: what other engines stored -----------------------------------------
    def discover(
        self, req: CacheRequest, pool: BlockPool, cap: int, extra: Iterable[int] = ()
    ) -> int:
        """Adopt the store's complete checkpoints of `req` up to `cap` tokens (a shared tier
        only); returns the blocks adopted."""
        shared = self._shared
        if shared is None or cap <= 0:
            return 0
        self._check_epoch()
        plan, index = self.plan, self.index
        groups = range(len(self.rules))
        keys = [req.keys(g) for g in groups]
        span = [rule.needed(cap).stop for rule in self.rules]
        wanted = [
            (g, key) for g in groups for key in keys[g][: span[g] + 1] if not index.holds(g, key)
        ]
        if all(key in pool.maps[g] for g, key in wanted):
            return 0  # the store could add nothing the pool lacks
        present = {item for item, found in zip(wanted, shared.probe(wanted), strict=True) if found}
        if not present:
            return 0
        points = plan.points(0, cap, extra)
        points = sorted(set(points) | set(range(plan.alignment, cap + 1, plan.alignment)))
        parent: bytes | None = None
        parent_r = 0
        adopted = 0
        for r in points:
            items = plan.items(keys, r, parent_r)
            if items is None:
                break
            if not all(
                index.holds(g, key) or (g, key) in present
                for g, pairs in enumerate(items)
                for _, key in pairs
            ):
                continue  # incomplete here; a later point may be (its parent stays)
            node = plan.node_id(keys, r)
            new = index.add_node(node, r, parent, items)
            if new is None:
                break  # no room
            index.stored([s.slot for s in new], True)
            adopted += len(new)
            parent, parent_r = node, r
        self.stats.blocks_adopted += adopted
        return adopted

    def _check_epoch(self) -> None:
        if self._shared is not None and self._shared.epoch != self._epoch:
            self._epoch = self._shared.epoch
            self.index.clear()
            self._chains.clear()
            self.stats.resets += 1

    # -- loads -----------------------------------------------------------------------------
    def start_load(self, req: CacheRequest, hit: LocalHit) -> TierJob:
        """Load `hit.tier` into the blocks the request's tables now hold there."""
        copies: list[TierCopy] = []
        for g, loads in enumerate(hit.tier):
            keys = req.keys(g)
            table = req.tables[g]
            copies.extend(TierCopy(g, keys[i], slot, table[i]) for i, slot in loads)
        return self.start_copies(req, copies)

    def start_copies(self, req: CacheRequest, copies: list[TierCopy]) -> TierJob:
        """Load `copies` (tier slot -> a fresh block of `req`); `poll` reports the job."""
        self.index.pin([c.slot for c in copies])
        job = self._submit(JobKind.LOAD, copies, req.request_id)
        self._loads[job.job_id] = req
        self.loading[req.request_id] = job
        return job

    def _submit(self, kind: JobKind, copies: list[TierCopy], request_id: str | None) -> TierJob:
        job = TierJob(self._next_job, kind, tuple(copies), request_id)
        self._next_job += 1
        if kind is JobKind.STORE:
            self.stats.store_jobs += 1
        else:
            self.stats.load_jobs += 1
        self.backend.submit(job)
        return job

    # -- completions -----------------------------------------------------------------------
    def poll(self, pool: BlockPool) -> list[tuple[CacheRequest, TierJob, bool]]:
        """Apply the jobs the backend finished; returns the loads that ended."""
        ended: list[tuple[CacheRequest, TierJob, bool]] = []
        self._check_epoch()
        for job, ok in self.backend.poll():
            slots = [c.slot for c in job.copies]
            if job.kind is JobKind.STORE:
                held = self._stores.pop(job.job_id)
                self.index.stored(slots, ok)
                pool.free(held)
                if ok:
                    self.stats.blocks_stored += job.num_blocks
                else:
                    self.stats.stores_failed += 1
                continue
            req = self._loads.pop(job.job_id)
            del self.loading[req.request_id]
            self.index.unpin(slots)
            if ok:
                self.stats.blocks_loaded += job.num_blocks
            else:
                self.stats.loads_failed += 1
                for c in job.copies:
                    self.index.drop_keys(c.group, [c.key])
            ended.append((req, job, ok))
        return ended

    def forget(self, req: CacheRequest) -> None:
        """The request ended: no more checkpoints of it."""
        self._chains.pop(req.request_id, None)

    @property
    def busy(self) -> bool:
        """Jobs are in flight."""
        return bool(self._stores or self._loads)

    def held_blocks(self) -> list[int]:
        """Device blocks in-flight stores hold (the invariant checker counts them)."""
        return [b for held in self._stores.values() for b in held]

    def shutdown(self) -> None:
        self.backend.shutdown()
