"""The router's index agrees with the engine it mirrors (docs/routing.md).

The index is fed the engine's own events on the wire format; its usable hit must equal what
the engine's cache manager would reuse for the same prompt (the engine is the oracle).
"""

from __future__ import annotations

import random

import pytest

from relaykv.common.messages.geometry_json import geometry_json, parse_geometry_json
from relaykv.common.messages.kv_events import KVEventBatch, batch_encoder
from relaykv.engine.kv_events import wire_event
from relaykv.kvcache import CacheRole, Geometry, GroupSpec, KVCacheManager, KVEvent
from relaykv.router.holders import KeyHolders
from relaykv.router.index import EngineIndex
from tests.kvcache.conftest import Driver, geometry, tokens

ENCODER = batch_encoder()


def _payload(events: list[KVEvent], geo) -> bytes:  # type: ignore[no-untyped-def]
    return ENCODER.encode(
        KVEventBatch(ts=0.0, events=[wire_event(e, geo) for e in events], data_parallel_rank=0)
    )


def _mirror(manager: KVCacheManager, role: str = "colocated", policy: str = "per-group"):  # type: ignore[no-untyped-def]
    served = geometry_json(manager.geometry)  # what the engine's /v1/kv_cache_info says
    index = EngineIndex(parse_geometry_json(served, GroupSpec, Geometry), role, policy)
    seq = iter(range(1 << 30))

    def sink(event: KVEvent) -> None:
        assert index.accept(next(seq), _payload([event], manager.geometry))

    manager.set_event_sink(sink)
    return index


@pytest.mark.parametrize(
    "groups,draft",
    [
        (("full:16", "sliding:16:64"), 0),
        (("full:16", "sliding:16:32"), 1),
        (("full:32", "sliding:16:48"), None),
    ],
)
def test_usable_hit_equals_the_engines_own_lookup(
    groups: tuple[str, ...], draft: int | None
) -> None:
    geo = geometry(*groups, draft=draft)
    engine = KVCacheManager(geo, 80)
    index = _mirror(engine)
    d = Driver(engine)
    rng = random.Random(1)
    systems = [tokens(rng.randrange(40, 200), seed=s) for s in range(5)]
    for i in range(40):
        prompt = systems[rng.randrange(5)] + tokens(rng.randrange(1, 60), seed=1000 + i)
        probe = engine.add_request(f"probe{i}", prompt)
        expected = engine._lookup(probe).tokens
        engine.release(probe)
        assert index.usable_hit(index.request(prompt)) == expected
        req, hit = d.prefill(prompt, chunk=48)
        assert hit == expected
        d.decode(req, rng.randrange(1, 10))
        d.finish(req)
        assert [set(m) for m in index.maps] == [set(m) for m in engine.pool.maps]


def test_prefill_role_applies_the_prefill_cap() -> None:
    geo = geometry("full:16", "sliding:16:32", draft=1)
    engine = KVCacheManager(geo, 200, pd_policy="per-group", pd_role=True)
    index = _mirror(engine, "prefill")
    d = Driver(engine)
    prompt = tokens(300)
    req, _ = d.prefill(prompt, role=CacheRole.PREFILL)
    engine.hold_for_transfer(req)
    engine.release(req)
    for extra in (0, 20, 100):
        p = prompt + tokens(extra, seed=9)
        probe = engine.add_request(f"p{extra}", p, role=CacheRole.PREFILL)
        expected = engine._lookup(probe).tokens
        engine.release(probe)
        assert index.usable_hit(index.request(p)) == expected
        assert expected > 0


def test_sequence_gaps_duplicates_and_clear() -> None:
    geo = geometry("full:16")
    index = EngineIndex(geo)
    a = _payload([KVEvent("stored", 0, (b"a" * 16,))], geo)
    b = _payload([KVEvent("stored", 0, (b"b" * 16,))], geo)
    assert index.accept(5, a) and index.expected == 6  # the first batch may start anywhere
    assert index.accept(5, a)  # duplicate: ignored
    assert not index.accept(7, b) and index.gaps == 1 and b"b" * 16 not in index.maps[0]
    assert index.accept(6, b) and set(index.maps[0]) == {b"a" * 16, b"b" * 16}
    assert index.accept(7, _payload([KVEvent("removed", 0, (b"a" * 16,))], geo))
    assert set(index.maps[0]) == {b"b" * 16}
    assert index.accept(8, _payload([KVEvent("cleared")], geo)) and index.num_blocks == 0
    assert index.accept(9, b"\xc1garbage") and index.events_dropped == 1
    bad_group = _payload([KVEvent("stored", 0, (b"c" * 16,))], geo).replace(
        b"group_idx\x00", b"group_idx\x07"
    )
    index.accept(10, bad_group)
    assert b"c" * 16 not in index.maps[0]
    index.reset()
    assert index.expected is None and index.resets == 1


def test_holders_bits_follow_every_engines_events() -> None:
    # The shared key -> engines bitmask map is what decode scoring probes instead of each
    # engine's map: after any stream of stores, removals, clears and resets it must hold
    # exactly the engines' keys.
    geo = geometry("full:16", "sliding:16:32", draft=0)
    holders = KeyHolders()
    indexes = [EngineIndex(geo, "decode", holders=holders) for _ in range(3)]
    rng = random.Random(4)
    keys = [bytes([i]) * 16 for i in range(24)]
    for step in range(400):
        index = indexes[rng.randrange(3)]
        kind = rng.choice(["stored", "stored", "removed", "cleared", "reset"])
        picked = tuple(rng.sample(keys, rng.randrange(1, 6)))
        if kind == "reset":
            index.reset()
        else:
            event = KVEvent(kind, rng.randrange(2), picked if kind != "cleared" else ())
            index.apply(_payload([event], geo))
        for group in range(2):
            for index in indexes:
                assert index.slot is not None
                bit = 1 << index.slot
                held = {k for k, mask in holders.group(group).items() if mask & bit}
                assert held == set(index.maps[group]), step
    indexes[0].close()
    assert all(not mask & (1 << 0) for gmap in holders.maps for _, mask in gmap.items())


def test_tier_events_make_tier_blocks_reachable_at_a_cost() -> None:
    """An engine with a KV tier (docs/tier.md): its events with medium CPU feed the index's
    tier maps; the usable hit counts what the tier adds beyond the device hit at
    TIER_WEIGHT, both computed by kvcache's own lookups."""
    from relaykv.kvcache.tier import InstantTier
    from relaykv.router.index import TIER_WEIGHT

    geo = geometry("full:16", "sliding:16:64", draft=0)
    engine = KVCacheManager(geo, 60, tier=InstantTier(400))
    index = _mirror(engine)
    rng = random.Random(2)
    systems = [tokens(rng.randrange(100, 300), seed=s) for s in range(4)]
    mixed = 0
    for i in range(24):
        prompt = systems[rng.randrange(4)] + tokens(rng.randrange(1, 40), seed=2000 + i)
        probe = engine.add_request(f"probe{i}", prompt)
        device = engine._lookup(probe).tokens
        tiered = engine._lookup(probe, tiered=True).tokens
        engine.release(probe)
        mixed += tiered > device
        want = device + int(TIER_WEIGHT * (tiered - device))
        assert index.usable_hit(index.request(prompt)) == want
        assert index.hit_bound(index.request(prompt)) >= want
        req = engine.add_request(f"r{i}", prompt)
        adm = engine.admit(req, len(prompt))
        assert adm is not None and adm.start == tiered
        engine.tier_poll()  # loads (and stores) of an instant tier end here
        engine.commit(req, len(prompt), [5])
        engine.release(req)
        engine.tier_poll()
        assert engine.tier is not None
        assert [set(m) for m in index.tier.maps] == [set(m) for m in engine.tier.index.maps]
        assert [set(m) for m in index.maps] == [set(m) for m in engine.pool.maps]
    assert mixed > 0  # some hits reached into the tier


def test_prefill_cap_memo_answers_as_kvcache_does() -> None:
    # `_prefill_cap` keeps its last answers by the request's lengths and the reach: asked in
    # any order for requests of any lengths, it answers what kvcache's rule computes.
    from relaykv.kvcache.pd_plan import prefill_hit_cap

    geo = geometry("full:16", "sliding:16:32", draft=0)
    rng = random.Random(9)
    index = EngineIndex(geo, "prefill", sibling_reach=64)
    requests = [index.request(list(range(rng.randrange(1, 600)))) for _ in range(12)]
    for _ in range(200):
        req, reach = rng.choice(requests), rng.random() < 0.5
        expected = prefill_hit_cap(
            geo, index.rules, index.pd_policy, req, index.sibling_reach if reach else 0
        )
        assert index._prefill_cap(req, reach) == expected
