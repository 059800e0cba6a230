"""The tier under a cache manager, with KV contents tracked (docs/tier.md).

A fake backend copies a simulated page content (`(group, key)` written when a block fills)
between the device pool and its slots, running jobs only when the test says so, in random
order, sometimes failing. A state machine admits, computes, decodes and releases requests on
a small pool (blocks get evicted and come back from the tier). After every step: the cache's
invariant checker (the tier index's included), and every block a running request reads holds
exactly the KV its key names: no hit ever uses a block outside what `GroupRules` says, for
random geometries of all three kinds with and without an EAGLE draft. Every admission's hit
equals the brute-force oracle over pool + tier.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from relaykv.cache_probe.oracle import oracle_hit
from relaykv.kvcache import NULL_BLOCK, CacheRequest, KVCacheManager, assert_consistent
from relaykv.kvcache.tier import JobKind, TieredKeys, TierJob

from ..strategies import branching_prompts, geometries

BASES = [[i % 5 for i in range(90)], [(i * 7) % 5 for i in range(90)], [3] * 90]


def prompts() -> st.SearchStrategy[list[int]]:
    return branching_prompts(BASES, 10)


class FakeTier:
    """A `TierBackend` over simulated page contents; jobs run when `run` is called."""

    name = "fake"
    medium = "CPU"

    def __init__(self, pages: dict[int, object], capacity: int) -> None:
        self.pages = pages  # device block -> content
        self.slots: dict[int, object] = {}
        self.capacity_blocks = capacity
        self.queued: list[TierJob] = []
        self.done: list[tuple[TierJob, bool]] = []

    def submit(self, job: TierJob) -> None:
        self.queued.append(job)

    def run(self, index: int, ok: bool) -> None:
        job = self.queued.pop(index % len(self.queued))
        if ok:
            for c in job.copies:
                if job.kind is JobKind.STORE:
                    self.slots[c.slot] = self.pages.get(c.block)
                else:
                    self.pages[c.block] = self.slots[c.slot]
        self.done.append((job, ok))

    def poll(self) -> list[tuple[TierJob, bool]]:
        out, self.done = self.done, []
        return out

    def shutdown(self) -> None:
        pass


class OffloadMachine(RuleBasedStateMachine):
    @initialize(
        geo=geometries(max_groups=3),
        blocks=st.integers(20, 60),
        capacity=st.integers(0, 80),
        mult=st.integers(1, 2),
    )
    def setup(self, geo, blocks, capacity, mult) -> None:
        self.pages: dict[int, object] = {}
        self.backend = FakeTier(self.pages, capacity)
        self.m = KVCacheManager(
            geo,
            blocks,
            max_in_flight_tokens=32,
            tier=self.backend,
            tier_interval=geo.alignment * mult,
        )
        self.running: list[CacheRequest] = []
        self.waiting_load: list[CacheRequest] = []
        self.computed: dict[str, int] = {}
        self.n = 0

    @staticmethod
    def _content(req: CacheRequest, g: int, b: int, i: int) -> object:
        """What block i of group g holds once written: its tokens and all before them (the
        chain hash of the prefix up to the block's end)."""
        return (g, req.hashes.hashes[(i + 1) * b // req.hashes.unit - 1])

    def _write(self, req: CacheRequest, start: int, end: int) -> None:
        """The model writes positions [start, end): blocks that fill get their content."""
        for spec in self.m.rules:
            b, g = spec.block_size, spec.index
            table = req.tables[g]
            for i in range(start // b, min(end // b, len(table))):
                if table[i] != NULL_BLOCK:
                    self.pages[table[i]] = self._content(req, g, b, i)

    def _compute(self, req: CacheRequest, start: int) -> None:
        pos = start
        while pos < req.num_tokens:
            end = min(req.num_tokens, pos + 24)
            if not self.m.reserve(req, end):
                self.m.release(req)
                self.computed.pop(req.request_id, None)
                return
            self._write(req, pos, end)
            self.m.commit(req, end)
            pos = end
        self.computed[req.request_id] = pos
        self.running.append(req)

    @rule(prompt=prompts())
    def admit(self, prompt) -> None:
        self.n += 1
        req = self.m.add_request(f"q{self.n}", prompt)
        tier = self.m.tier
        assert tier is not None
        want = oracle_hit(req, self.m.rules, TieredKeys(self.m.pool, tier.index))
        adm = self.m.admit(req, 1 << 20)
        if adm is None:
            self.m.release(req)
            return
        assert adm.start == want
        if adm.loads_from_tier:
            self.waiting_load.append(req)
            self.computed[req.request_id] = adm.start
            return
        self._write(req, adm.start, req.num_tokens)
        self.m.commit(req, req.num_tokens)
        self.computed[req.request_id] = req.num_tokens
        self.running.append(req)

    @precondition(lambda self: self.backend.queued)
    @rule(index=st.integers(0, 50), ok=st.sampled_from([True, True, True, False]))
    def tier_runs(self, index, ok) -> None:
        self.backend.run(index, ok)

    @rule()
    def poll(self) -> None:
        for req, ok in self.m.tier_poll():
            self.waiting_load.remove(req)
            if ok:
                self._check_reads(req)
                self._compute(req, self.computed[req.request_id])
            else:
                self.computed.pop(req.request_id)
                self.m.release(req)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), steps=st.integers(1, 5))
    def decode(self, data, steps) -> None:
        req = data.draw(st.sampled_from(self.running))
        for _ in range(steps):
            req.append_tokens([2])
            n = req.num_tokens
            if not self.m.reserve(req, n):
                self.running.remove(req)  # the pool is short: give up the request
                self.computed.pop(req.request_id)
                self.m.release(req)
                break
            self._write(req, n - 1, n)
            self.m.commit(req, n)
            self.computed[req.request_id] = n

    @precondition(lambda self: self.running or self.waiting_load)
    @rule(data=st.data())
    def release(self, data) -> None:
        req = data.draw(st.sampled_from(self.running + self.waiting_load))
        if req in self.running:
            self.running.remove(req)
        else:
            self.waiting_load.remove(req)  # released while its load flies: deferred
        self.computed.pop(req.request_id, None)
        self.m.release(req)

    def _check_reads(self, req: CacheRequest) -> None:
        """Every block the request holds below what it computed holds its key's KV, and
        its tables hold every block `needed` names at that point."""
        done = self.computed[req.request_id]
        for spec in self.m.rules:
            g, b = spec.index, spec.block_size
            table = req.tables[g]
            for i in range(min(done // b, len(table))):
                if table[i] != NULL_BLOCK:
                    assert self.pages.get(table[i]) == self._content(req, g, b, i), (g, i)
            for i in spec.needed(done):
                if i < done // b:
                    assert table[i] != NULL_BLOCK, (g, i)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "m"):
            return
        assert_consistent(self.m)
        for req in self.running:
            self._check_reads(req)


OffloadMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_offload_machine = OffloadMachine.TestCase
