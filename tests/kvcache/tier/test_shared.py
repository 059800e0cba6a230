"""A shared tier (a store several engines write) under cache managers (docs/tier.md, "Mooncake
Store"): what engine A stored, engine B finds (`KVTier.discover`) and loads.

The fake store keeps simulated page contents by `(group, key)`, as Mooncake Store keeps
objects by name. After A computed some prompts and its stores ran, a fresh engine B admits
a prompt: its hit equals the brute-force oracle over what the store holds (every complete
resume point is found, no hit ever uses a block outside `GroupRules`' `needed`), and every
block it loads holds the KV its key names. When the store's epoch changes (its master died),
B forgets its index and misses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import event, given, settings
from hypothesis import strategies as st

from relaykv.cache_probe.oracle import oracle_hit
from relaykv.kvcache import (
    NULL_BLOCK,
    CacheRequest,
    CacheRole,
    KVCacheManager,
    KVLoad,
    assert_consistent,
)
from relaykv.kvcache.tier import JobKind, SharedTierBackend, TieredKeys, TierJob

from ..strategies import geometries, related_prompts


class FakeStore:
    """Objects by (group, key); `up` False: every call fails, as with a dead master."""

    def __init__(self) -> None:
        self.objects: dict[tuple[int, bytes], object] = {}
        self.up = True
        self.epoch = 0

    def set_up(self, up: bool) -> None:
        if up != self.up:
            self.up = up
            self.epoch += 1


class StoreClientTier:
    """One engine's `SharedTierBackend` over a `FakeStore`; jobs run at `run_all`."""

    name = "fake-store"
    medium = "CPU"

    def __init__(self, store: FakeStore, pages: dict[int, object], capacity: int) -> None:
        self.store = store
        self.pages = pages
        self.capacity_blocks = capacity
        self.queued: list[TierJob] = []
        self.done: list[tuple[TierJob, bool]] = []
        self.probes = 0

    @property
    def epoch(self) -> int:
        return self.store.epoch

    def probe(self, items: Sequence[tuple[int, bytes]]) -> list[bool]:
        self.probes += 1
        return [self.store.up and item in self.store.objects for item in items]

    def submit(self, job: TierJob) -> None:
        self.queued.append(job)

    def run_all(self) -> None:
        for job in self.queued:
            ok = self.store.up
            if ok and job.kind is JobKind.STORE:
                for c in job.copies:
                    self.store.objects[(c.group, c.key)] = self.pages.get(c.block)
            elif ok:
                ok = all((c.group, c.key) in self.store.objects for c in job.copies)
                for c in job.copies if ok else ():
                    self.pages[c.block] = self.store.objects[(c.group, c.key)]
            self.done.append((job, ok))
        self.queued.clear()

    def poll(self) -> list[tuple[TierJob, bool]]:
        out, self.done = self.done, []
        return out

    def shutdown(self) -> None:
        pass


class StoreKeysView:
    """`CachedKeys` of what the store holds (for the oracle)."""

    def __init__(self, store: FakeStore, groups: int) -> None:
        self.maps: list[Mapping[bytes, int]] = [
            {k: 1 for (g, k) in store.objects if g == group} for group in range(groups)
        ]


class Engine:
    def __init__(self, geo, store: FakeStore, blocks: int = 200, **pd: object) -> None:
        self.pages: dict[int, object] = {}
        self.tier = StoreClientTier(store, self.pages, 10_000)
        self.m = KVCacheManager(geo, blocks, max_in_flight_tokens=64, tier=self.tier, **pd)

    def content(self, req: CacheRequest, g: int, i: int) -> object:
        b = self.m.rules[g].block_size
        return (g, req.hashes.hashes[(i + 1) * b // req.hashes.unit - 1])

    def write(self, req: CacheRequest, start: int, end: int) -> None:
        for rule in self.m.rules:
            b, g = rule.block_size, rule.index
            table = req.tables[g]
            for i in range(start // b, min(end // b, len(table))):
                if table[i] != NULL_BLOCK:
                    self.pages[table[i]] = self.content(req, g, i)

    def serve(self, rid: str, prompt: list[int]) -> int:
        """Admit, load what the tier has, compute the rest, release; returns the hit."""
        req = self.m.add_request(rid, prompt)
        adm = self.m.admit(req, 1 << 20)
        assert adm is not None
        if adm.loads_from_tier:
            self.tier.run_all()
            [(done, ok)] = self.m.tier_poll()
            assert done is req and ok
            self.check_reads(req, adm.start)
            assert self.m.reserve(req, req.num_tokens)
        self.write(req, adm.start, req.num_tokens)
        self.m.commit(req, req.num_tokens)
        self.tier.run_all()
        self.m.tier_poll()
        self.m.release(req)
        assert_consistent(self.m)
        return adm.start

    def check_reads(self, req: CacheRequest, done: int) -> None:
        for rule in self.m.rules:
            g, b = rule.index, rule.block_size
            for i in rule.needed(done):
                block = req.tables[g][i]
                assert block != NULL_BLOCK, (g, i)
                if i < done // b:
                    assert self.pages[block] == self.content(req, g, i), (g, i)


@settings(max_examples=80, deadline=None)
@given(geo=geometries(max_groups=3), prompts=related_prompts(count=4, max_len=90), pick=st.data())
def test_engine_b_hits_what_a_stored(geo, prompts, pick) -> None:
    store = FakeStore()
    a = Engine(geo, store)
    for i, prompt in enumerate(prompts):
        a.serve(f"a{i}", prompt)
    b = Engine(geo, store)
    assert isinstance(b.tier, SharedTierBackend)
    tail = pick.draw(st.lists(st.integers(0, 4), max_size=9))
    prompt = pick.draw(st.sampled_from(prompts)) + tail
    req = b.m.add_request("probe", prompt)
    want = oracle_hit(req, b.m.rules, TieredKeys(b.m.pool, StoreKeysView(store, geo.num_groups)))
    b.m.release(req)
    event("store hit" if want else "miss")
    assert b.serve("b0", prompt) == want


def test_lost_master_forgets_and_misses() -> None:
    from relaykv.kvcache import Geometry, GroupSpec

    geo = Geometry((GroupSpec("full", 4), GroupSpec("sliding", 4, window=8)))
    store = FakeStore()
    a, b = Engine(geo, store), Engine(geo, store)
    prompt = list(range(40))
    a.serve("a0", prompt)
    assert b.serve("b0", [*prompt, 1]) >= 32  # from the store
    assert b.m.tier is not None and b.m.tier.stats.blocks_adopted > 0
    store.set_up(False)  # the master died: its objects are gone with it
    store.objects.clear()
    other = [7] * 40
    assert b.serve("b1", other) == 0  # serving goes on, without the store
    assert b.m.tier.stats.resets == 1 and not b.m.tier.index.nodes
    store.set_up(True)  # a new master, empty
    a.serve("a1", other)
    assert b.serve("b2", [*other, 2]) >= 32  # hits again


# -- the decode side of P/D: load from the store what it can, ask P for the rest ----------


def _decode(geo, store: FakeStore, policy: str) -> Engine:
    return Engine(geo, store, 1000, pd_policy=policy, pd_role=True)


def _prefill(p: Engine, rid: str, prompt: list[int]) -> None:
    """P computes `prompt` (its stores run) and lets it go (what D reads is simulated)."""
    req = p.m.add_request(rid, prompt, role=CacheRole.PREFILL)
    adm = p.m.admit(req, 1 << 20)
    assert adm is not None
    if adm.loads_from_tier:
        p.tier.run_all()
        p.m.tier_poll()
    p.write(req, adm.start, req.num_tokens)
    p.m.commit(req, req.num_tokens)
    p.m.hold_for_transfer(req)
    p.tier.run_all()
    p.m.tier_poll()
    p.m.release(req)


def _receive(d: Engine, rid: str, prompt: list[int], release_early: bool = False) -> KVLoad:
    """D receives `prompt`: the tier fills `from_tier`, "P" fills `receive` with the right
    contents; returns the delivered load with every held block checked."""
    req = d.m.add_request(rid, prompt, role=CacheRole.DECODE)
    load = d.m.receive(req)
    assert load is not None
    held = [set(load.plan.held[g]) for g in range(len(d.m.rules))]
    for g, rule_held in enumerate(held):
        sources = [
            set(load.local[g]),
            set(load.attached[g]),
            {k for k, _ in load.receive[g]},
            {k for k, _, _ in load.from_tier[g]},
        ]
        assert sum(len(s) for s in sources) == len(rule_held) and set().union(*sources) == rule_held
    if release_early:
        d.m.release(req)
    for g, items in enumerate(load.receive):
        for k, block in items:
            if k < req.num_prompt_tokens // d.m.rules[g].block_size:  # a full block
                d.pages[block] = d.content(req, g, k)
    delivered = d.m.load_finished(load, True) if load.needs_transfer else []
    assert (load in delivered) == (not any(load.from_tier) and not release_early)
    d.tier.run_all()
    d.m.tier_poll()
    delivered += d.m.tier_delivered()
    if release_early:
        assert not delivered
        assert d.m.pool.num_free == d.m.pool.num_usable  # nothing leaked
        return load
    assert delivered == [load] and load.ok
    for g, blocks in enumerate(held):
        for k in blocks:
            block = req.tables[g][k]  # (a window block D no longer needs is free: null)
            if block != NULL_BLOCK and k < req.num_prompt_tokens // d.m.rules[g].block_size:
                assert d.pages[block] == d.content(req, g, k), (g, k)
    assert d.m.reserve(req, req.num_tokens)
    d.m.commit(req, req.num_tokens)
    d.m.release(req)
    assert_consistent(d.m)
    return load


@settings(max_examples=60, deadline=None)
@given(
    geo=geometries(max_groups=3),
    policy=st.sampled_from(["per-group", "legacy", "exact"]),
    shared=st.integers(40, 120),
    tails=st.tuples(st.integers(1, 20), st.integers(1, 20)),
    early=st.booleans(),
)
def test_decode_loads_from_the_store_and_asks_p_for_the_rest(
    geo, policy, shared, tails, early
) -> None:
    store = FakeStore()
    p = Engine(geo, store, 1000, pd_policy=policy, pd_role=True)
    x = [i % 7 for i in range(shared)]
    xa, xb = x + [5] * tails[0], x + [6] * tails[1]
    _prefill(p, "pa", xa)
    cold = _decode(geo, FakeStore(), policy)
    full = _receive(cold, "cold", xb)  # a decode engine without the store: all from P
    _prefill(p, "pb", xb)
    d = _decode(geo, store, policy)
    load = _receive(d, "warm", xb, release_early=early)
    from_p = sum(len(r) for r in load.receive)
    assert from_p + sum(len(t) for t in load.from_tier) == sum(len(r) for r in full.receive)
    unit = max(geo.alignment, *(rule.block_size for rule in d.m.rules))
    if any(spec.kind == "full" for spec in geo.groups) and shared >= 4 * unit:
        assert any(load.from_tier)  # the shared prefix's full blocks came from the store


def test_restarted_decode_engine_asks_p_for_a_quarter() -> None:
    from relaykv.kvcache import Geometry, GroupSpec

    geo = Geometry((GroupSpec("full", 16), GroupSpec("sliding", 16, window=64)))
    store = FakeStore()
    p = Engine(geo, store, 1000, pd_role=True)
    x = [i % 11 for i in range(1024)]
    xa, xb = [*x, *range(32)], [*x, *range(40, 72)]
    _prefill(p, "pa", xa)
    first = _receive(_decode(geo, store, "per-group"), "d-a", xa)
    restarted = _decode(geo, store, "per-group")  # kill -9 and restart: an empty pool
    _prefill(p, "pb", xb)
    second = _receive(restarted, "d-b", xb)
    # x+a's prompt KV (what D held after it, from P or the store) against what P sent for
    # x+b: at most a quarter; the shared prefix came from the store.
    moved = sum(len(r) + len(t) for r, t in zip(first.receive, first.from_tier, strict=True))
    from_p = sum(len(r) for r in second.receive)
    assert from_p * 4 <= moved and any(second.from_tier), (from_p, moved)


def _decode_steps(d: Engine, rid: str, prompt: list[int], steps: int) -> None:
    """D receives `prompt` from P, then decodes `steps` tokens (its stores run)."""
    req = d.m.add_request(rid, prompt, role=CacheRole.DECODE)
    load = d.m.receive(req)
    assert load is not None
    if load.needs_transfer:
        d.m.load_finished(load, True)
    d.tier.run_all()
    d.m.tier_poll()
    d.m.tier_delivered()
    for token in range(steps):  # each step writes one position and samples a token
        assert d.m.reserve(req, req.num_tokens)
        d.m.commit(req, req.num_tokens, [token % 5])
    d.tier.run_all()
    d.m.tier_poll()
    d.m.release(req)
    assert_consistent(d.m)


def test_decode_engine_stores_only_what_it_computed() -> None:
    """What a decode engine puts lives in its own part of the store and goes when it goes:
    the prompt it received is its prefill engine's to store. P's stores went elsewhere here
    (as when P's part of the store was not back yet after a master restart): D leaves the
    store without the prompt, and without its own checkpoints, which would carry it. P's
    stores in the store: D's checkpoints hang under P's and add only D's blocks."""
    from relaykv.kvcache import Geometry, GroupSpec

    geo = Geometry((GroupSpec("full", 16), GroupSpec("sliding", 16, window=64)))
    store = FakeStore()
    prompt = [i % 11 for i in range(100)]
    elsewhere = Engine(geo, FakeStore(), 1000, pd_role=True)
    _prefill(elsewhere, "pa", prompt)
    d = _decode(geo, store, "per-group")
    _decode_steps(d, "d-a", prompt, 40)
    assert store.objects == {}

    p = Engine(geo, store, 1000, pd_role=True)
    _prefill(p, "pb", prompt)
    before = set(store.objects)
    _decode_steps(d, "d-b", prompt, 40)
    added = set(store.objects) - before
    req = d.m.add_request("keys", [*prompt, *[t % 5 for t in range(40)]])
    prompt_blocks = {(g, key) for g in range(2) for key in req.keys(g)[: len(prompt) // 16]}
    d.m.release(req)
    assert added and not added & prompt_blocks
