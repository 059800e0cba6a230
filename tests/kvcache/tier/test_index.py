"""The tier index and the tiered lookup under random operations (docs/tier.md).

A state machine inserts the checkpoints of random sequences into a small tier (so eviction
runs), completes or fails their stores, pins and unpins slots as loads do, and looks random
prompts up over a random device map plus the tier. After every step the index's invariant
checker runs (every checkpoint is a complete resume point: its chain holds every group's
`needed(r)`), and every lookup is compared with the brute-force oracle over pool + tier. All
three kinds, with and without an EAGLE draft (strategies.geometries).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from relaykv.cache_probe.oracle import oracle_hit
from relaykv.kvcache import NULL_BLOCK, CacheRequest, rules_for
from relaykv.kvcache.tier import TieredKeys, TierIndex, TierPlan, find_tiered_hit

from ..strategies import branching_prompts, geometries

BASES = [[i % 5 for i in range(90)], [(i * 7) % 5 for i in range(90)]]


def prompts() -> st.SearchStrategy[list[int]]:
    return branching_prompts(BASES, 12)


class _Maps:
    def __init__(self, maps: list[dict[bytes, int]]) -> None:
        self.maps = maps


class TierMachine(RuleBasedStateMachine):
    @initialize(geo=geometries(max_groups=3), mult=st.integers(1, 3), cap=st.integers(0, 40))
    def setup(self, geo, mult, cap) -> None:
        self.geo = geo
        self.rules = rules_for(geo)
        self.plan = TierPlan(self.rules, geo.alignment * mult)
        self.events: list[tuple[str, int, tuple[bytes, ...]]] = []
        self.index = TierIndex(len(self.rules), cap, lambda *e: self.events.append(e))
        self.keys_of: dict[bytes, list[list[bytes]]] = {}
        self.pending: list[list[int]] = []
        self.pinned: list[list[int]] = []
        self.device = _Maps([{} for _ in self.rules])
        self.n = 0

    def _req(self, prompt: list[int]) -> CacheRequest:
        self.n += 1
        return CacheRequest(f"q{self.n}", prompt, self.rules, self.geo.hash_unit)

    @rule(prompt=prompts(), extra=st.booleans())
    def offload(self, prompt, extra) -> None:
        req = self._req(prompt)
        keys = [req.keys(g) for g in range(len(self.rules))]
        n = len(prompt)
        more = [(n - 1) // self.geo.alignment * self.geo.alignment] if extra else []
        parent: tuple[int, bytes | None] = (0, None)
        for r in self.plan.points(0, n, more):
            if self.plan.ready_at(r) > n:
                break
            items = self.plan.items(keys, r, parent[0])
            if items is None:
                break
            node = self.plan.node_id(keys, r)
            new = self.index.add_node(node, r, parent[1], items)
            if new is None:
                break
            self.keys_of.setdefault(node, keys)
            if new:
                self.pending.append([s.slot for s in new])
            parent = (r, node)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), ok=st.booleans())
    def store_ends(self, data, ok) -> None:
        job = data.draw(st.sampled_from(self.pending))
        self.pending.remove(job)
        self.index.stored(job, ok)

    @rule(data=st.data())
    def pin(self, data) -> None:
        visible = sorted({s for m in self.index.maps for s in m.values()})
        if visible:
            slots = data.draw(st.lists(st.sampled_from(visible), max_size=4, unique=True))
            self.index.pin(slots)
            self.pinned.append(slots)

    @precondition(lambda self: self.pinned)
    @rule(data=st.data())
    def unpin(self, data) -> None:
        slots = data.draw(st.sampled_from(self.pinned))
        self.pinned.remove(slots)
        self.index.unpin(slots)

    @rule(prompt=prompts(), keep=st.integers(0, 3))
    def device_caches(self, prompt, keep) -> None:
        """The device pool holds some of a sequence's blocks (every `keep`-th, or none)."""
        req = self._req(prompt)
        for g in range(len(self.rules)):
            for i, key in enumerate(req.keys(g)):
                if keep and i % keep == 0:
                    self.device.maps[g][key] = 1 + i

    @rule(prompt=prompts())
    def lookup(self, prompt) -> None:
        req = self._req(prompt)
        hit = find_tiered_hit(req, self.rules, self.device, self.index)
        assert hit.tokens == oracle_hit(req, self.rules, TieredKeys(self.device, self.index))
        for rule_ in self.rules:
            g = rule_.index
            keys = req.keys(g)
            loads = dict(hit.tier[g])
            assert len(hit.blocks[g]) == hit.tokens // rule_.block_size
            for i in rule_.needed(hit.tokens):
                if i >= len(hit.blocks[g]):
                    continue  # an EAGLE peek block proves the point; it is recomputed
                key = keys[i]
                if i in loads:
                    assert hit.blocks[g][i] == NULL_BLOCK and key not in self.device.maps[g]
                    assert self.index.maps[g][key] == loads[i]
                else:
                    assert self.device.maps[g][key] == hit.blocks[g][i]

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "index"):
            assert self.index.check(self.plan, self.keys_of.__getitem__) == []
            live = {(g, k) for g, m in enumerate(self.index.maps) for k in m}
            shown: set[tuple[int, bytes]] = set()
            for kind, g, keys in self.events:
                for k in keys:
                    (shown.add if kind == "stored" else shown.discard)((g, k))
            assert shown == live  # the tier's events replay to what it serves


TierMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
test_tier_machine = TierMachine.TestCase
