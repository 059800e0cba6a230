"""Random sequences of requests, frees, evictions and P/D loads (docs/design.md §3, §5, §7).

A state machine drives a prefill engine P and a decode engine D through the real managers with
small pools (so allocation fails and blocks get evicted); after every step both invariant
checkers run, and every lookup is compared with the brute-force oracle.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from relaykv.cache_probe.oracle import oracle_hit
from relaykv.kvcache import (
    PD_POLICIES,
    CacheRole,
    KVCacheManager,
    assert_consistent,
)

from .strategies import geometries

PROMPT_BASES = [[i % 5 for i in range(70)], [(i * 7) % 5 for i in range(70)]]


def prompts() -> st.SearchStrategy[list[int]]:
    base = st.sampled_from(PROMPT_BASES)
    return st.builds(
        lambda b, keep, tail: (b[:keep] + tail) or [1],
        base,
        st.integers(0, 70),
        st.lists(st.integers(0, 4), max_size=12),
    )


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        geo=geometries(max_groups=3),
        policy=st.sampled_from(PD_POLICIES),
        retention=st.sampled_from(["boundaries", "dense", "interval"]),
        blocks=st.integers(24, 96),
    )
    def setup(self, geo, policy, retention, blocks) -> None:
        if retention == "interval":
            retention = f"interval:{geo.alignment * 2}"
        kw = dict(retention=retention, pd_policy=policy, pd_role=True, max_in_flight_tokens=32)
        self.p = KVCacheManager(geo, blocks, **kw)
        self.d = KVCacheManager(geo, blocks, **kw)
        self.running: list[tuple[KVCacheManager, object]] = []
        self.loads: list[tuple[object, object]] = []  # (D load, P request)
        self.n = 0

    def _id(self) -> str:
        self.n += 1
        return f"q{self.n}"

    def _prefill(self, m: KVCacheManager, prompt: list[int], role: CacheRole, chunk: int):
        req = m.add_request(self._id(), prompt, role=role)
        hit = m._lookup(req)
        cap = m._prefill_hit_cap(req) if role is CacheRole.PREFILL else None
        assert hit.tokens == oracle_hit(req, m.rules, m.pool, cap)
        pos = hit.tokens
        first = True
        while pos < len(prompt):
            end = min(len(prompt), pos + chunk)
            if not m._allocate(req, end, hit=hit if first else None):
                m.release(req)
                return None
            first = False
            m._cache(req, end)
            m._free_skipped(req, end)
            pos = end
        return req

    @rule(prompt=prompts(), chunk=st.integers(1, 40), on_d=st.booleans())
    def colocated(self, prompt, chunk, on_d) -> None:
        m = self.d if on_d else self.p
        req = self._prefill(m, prompt, CacheRole.COLOCATED, chunk)
        if req is not None:
            self.running.append((m, req))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), steps=st.integers(1, 6))
    def decode(self, data, steps) -> None:
        m, req = data.draw(st.sampled_from(self.running))
        for _ in range(steps):
            req.append_tokens([3])
            if not m._allocate(req, req.num_tokens, lookahead=2):
                break
            m._cache(req, req.num_tokens)
            m._free_skipped(req, req.num_tokens)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data) -> None:
        item = data.draw(st.sampled_from(self.running))
        self.running.remove(item)
        item[0].release(item[1])

    @rule(prompt=prompts(), chunk=st.integers(4, 64))
    def start_transfer(self, prompt, chunk) -> None:
        p_req = self._prefill(self.p, prompt, CacheRole.PREFILL, chunk)
        if p_req is None:
            return
        held = self.p.hold_for_transfer(p_req)
        d_req = self.d.add_request(self._id(), prompt, role=CacheRole.DECODE)
        load = self.d.receive(d_req)
        if load is None:
            self.d.release(d_req)
            self.p.release(p_req)
            return
        load.transfer_pairs(held)  # P holds everything D will ask for
        if load.needs_transfer:
            self.loads.append((load, p_req))
        else:
            self.p.release(p_req)
            if load.delivered:
                self._start_decode(load)

    def _start_decode(self, load) -> None:
        req = load.request
        n = req.num_prompt_tokens
        self.d._free_skipped(req, n - 1)
        if self.d._allocate(req, n):
            self.d._cache(req, n)
            self.running.append((self.d, req))
        else:
            self.d.release(req)

    @precondition(lambda self: self.loads)
    @rule(data=st.data(), ok=st.booleans())
    def complete_transfer(self, data, ok) -> None:
        load, p_req = data.draw(st.sampled_from(self.loads))
        self.loads.remove((load, p_req))
        self.p.release(p_req)
        for settled in self.d.load_finished(load, ok):
            if settled.ok:
                self._start_decode(settled)
            else:
                self.d.release(settled.request)

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    def abort_during_transfer(self, data) -> None:
        load, _ = data.draw(st.sampled_from(self.loads))
        if load.request.load is load:
            self.d.release(load.request)

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "p"):
            assert_consistent(self.p)
            assert_consistent(self.d)

    def teardown(self) -> None:
        if not hasattr(self, "p"):
            return
        for load, p_req in list(self.loads):
            self.p.release(p_req)
            for settled in self.d.load_finished(load, ok=False):
                self.d.release(settled.request)
        for m, req in self.running:
            m.release(req)
        for m in (self.p, self.d):
            assert_consistent(m)
            assert m.pool.num_free == m.pool.num_usable, "blocks leaked"
            assert not m.requests and not m.loads.active


CacheMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
TestCacheMachine = CacheMachine.TestCase
