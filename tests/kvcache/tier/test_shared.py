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
from relaykv.kvcache import NULL_BLOCK, CacheRequest, KVCacheManager, assert_consistent
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
    def __init__(self, geo, store: FakeStore, blocks: int = 200, capacity: int = 10_000) -> None:
        self.pages: dict[int, object] = {}
        self.tier = StoreClientTier(store, self.pages, capacity)
        self.m = KVCacheManager(geo, blocks, max_in_flight_tokens=64, tier=self.tier)

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
