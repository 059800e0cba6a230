"""Prefixes in flight on a prefill engine (router/pending.py): a sibling that arrives while
the first request of its prefix is computed is scored as the engine will serve it."""

from __future__ import annotations

import asyncio
import random

import pytest

from relaykv.kvcache import CacheRole, KVCacheManager
from relaykv.router.backends import BackendPool
from relaykv.router.index import EngineIndex
from relaykv.router.pending import LOAD_WAIT_S, InFlight, InFlightPrefixes, shared_units
from relaykv.router.prompt import Prompt
from relaykv.router.routing import Routing
from tests.kvcache.conftest import Driver, geometry, tokens


def test_shared_units_equals_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randbytes(2) for _ in range(rng.randrange(0, 12))]
        cut = rng.randrange(0, len(a) + 1)
        b = a[:cut] + [rng.randbytes(3) for _ in range(rng.randrange(0, 5))]
        brute = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        assert shared_units(a, b) == (min(len(a), len(b)) if brute is None else brute)


@pytest.mark.parametrize("groups,draft", [(("full:16", "sliding:16:32"), 0), (("full:16",), 0),
                                          (("full:32", "sliding:16:48"), None)])
def test_in_flight_hit_equals_what_a_dense_prefill_engine_serves(
    groups: tuple[str, ...], draft: int | None
) -> None:
    geo = geometry(*groups, draft=draft)
    rng = random.Random(len(groups))
    for trial in range(12):
        system = tokens(rng.randrange(30, 300), seed=trial)
        first = system + tokens(rng.randrange(1, 60), seed=100 + trial)
        sibling = system + tokens(rng.randrange(1, 60), seed=200 + trial)
        index = EngineIndex(geo, "prefill", "per-group")
        pending = InFlightPrefixes()
        pending.begin("P", Prompt(first))
        mine = Prompt(sibling)
        req = mine.request_for(index)
        estimate = pending.hit("P", mine, index, index.resume_cap(req))
        # The reference: a prefill engine with every window kept, once `first` was computed.
        engine = KVCacheManager(geo, 400, retention="dense", pd_policy="per-group", pd_role=True)
        done, _ = Driver(engine).prefill(first, role=CacheRole.PREFILL)
        engine.hold_for_transfer(done)
        engine.release(done)
        probe = engine.add_request("probe", sibling, role=CacheRole.PREFILL)
        assert estimate == engine._lookup(probe).tokens, (trial, len(system))
        engine.release(probe)


def test_a_sibling_follows_its_prefix_to_the_engine_computing_it() -> None:
    geo = geometry("full:16", "sliding:16:32", draft=0)
    routing = Routing("cache-aware")
    pool = BackendPool("prefill", ["http://p0", "http://p1"])
    for b in pool.backends:
        t = routing.engines.tracker(b)
        t.index, t.subscriber = EngineIndex(geo, "prefill"), object()  # type: ignore[assignment]
    system = tokens(400)
    a, b = Prompt(system + tokens(30, seed=1)), Prompt(system + tokens(30, seed=2))
    computing = routing.pick(pool, set(), a)
    assert computing is not None
    first = computing.backend
    with computing:
        first.in_flight += 1
        # Nothing indexed anywhere yet; the engine computing the prefix still wins.
        sibling = routing.pick(pool, set(), b)
        assert sibling is not None and sibling.backend is first
        assert sibling.record.scored_hit > 0
        first.in_flight -= 1
        assert computing.note_answer({"usage": {"prompt_tokens_details": {"cached_tokens": 7}}})
    assert routing.recent[0].cached_tokens == 7  # the record of `a`'s prefill decision
    assert routing.in_flight.count(first.url) == 0
    other = Prompt(tokens(430, seed=3))  # an unrelated prompt is judged on load and caches
    index = routing.engines.tracker(first).index
    assert index is not None and routing.in_flight.hit(first.url, other, index, 400) == 0


def test_a_decode_sibling_waits_for_the_load_of_its_prefix() -> None:
    geo = geometry("full:16", "sliding:16:32", draft=0)
    routing = Routing("cache-aware")
    pool = BackendPool("decode", ["http://d0"])
    backend = pool.backends[0]
    t = routing.engines.tracker(backend)
    t.index, t.subscriber = EngineIndex(geo, "decode"), object()  # type: ignore[assignment]
    index = t.index
    system = tokens(400)
    a, b = Prompt(system + tokens(30, seed=1)), Prompt(system + tokens(30, seed=2))
    unrelated = Prompt(tokens(430, seed=3))

    async def scenario() -> list[str]:
        order: list[str] = []
        first = InFlight(routing.in_flight, backend.url, a)
        second = InFlight(routing.in_flight, backend.url, b)
        other = InFlight(routing.in_flight, backend.url, unrelated)

        async def sibling() -> None:
            await routing.in_flight.wait_for_load(backend, b, index, second)
            order.append("sibling sent")

        task = asyncio.create_task(sibling())
        await routing.in_flight.wait_for_load(backend, unrelated, index, other)  # shares nothing
        order.append("unrelated sent")
        # never waits for a later one:
        await routing.in_flight.wait_for_load(backend, a, index, first)
        order.append("first sent")
        await asyncio.sleep(0.05)
        order.append("first loaded")

        async def stream():  # type: ignore[no-untyped-def]
            yield b"data: 1"
            order.append("stream went on")

        with first:
            chunks = first.until_first(stream())
        await asyncio.sleep(0.02)
        assert not task.done()  # handed to the stream: ends at its first bytes, not at exit
        assert await chunks.__anext__() == b"data: 1"
        await task
        await chunks.aclose()
        for entry in (second, other):
            entry.done()
        return order

    assert asyncio.run(scenario()) == [
        "unrelated sent", "first sent", "first loaded", "sibling sent"
    ]
    assert routing.in_flight.waits == 1
    assert routing.in_flight.count(backend.url) == 0


def test_an_entry_never_ended_expires() -> None:
    # A stream the client never read leaves no permanent wait or phantom hit behind.
    geo = geometry("full:16", "sliding:16:32", draft=0)
    now = [0.0]
    pending = InFlightPrefixes(clock=lambda: now[0])
    index = EngineIndex(geo, "decode")
    system = tokens(400)
    a, b = Prompt(system + tokens(30, seed=1)), Prompt(system + tokens(30, seed=2))
    pending.begin("D", a)
    assert pending.hit("D", b, index, 429) > 0 and len(pending.awaited("D", b, index)) == 1
    now[0] = LOAD_WAIT_S + 1
    assert pending.hit("D", b, index, 429) == 0 and pending.awaited("D", b, index) == []
    assert pending.count("D") == 0


def test_siblings_wait_for_the_first_load_not_for_each_other() -> None:
    # A hot prefix: many siblings on one decode engine; each proceeds once any earlier one
    # has loaded the prefix (no convoy), counted on the engine while it waits.
    geo = geometry("full:16", "sliding:16:32", draft=0)
    routing = Routing("cache-aware")
    backend = BackendPool("decode", ["http://d0"]).backends[0]
    t = routing.engines.tracker(backend)
    t.index, t.subscriber = EngineIndex(geo, "decode"), object()  # type: ignore[assignment]
    index = t.index
    system = tokens(400)
    prompts = [Prompt(system + tokens(30, seed=i)) for i in range(4)]

    async def scenario() -> None:
        entries = [InFlight(routing.in_flight, backend.url, p) for p in prompts]
        waiting = [
            asyncio.create_task(routing.in_flight.wait_for_load(backend, p, index, e))
            for p, e in zip(prompts[2:], entries[2:], strict=True)
        ]
        await asyncio.sleep(0.01)
        assert backend.in_flight == 2 and not any(w.done() for w in waiting)
        entries[0].done()  # the first load is answered; the second is still loading
        await asyncio.wait_for(asyncio.gather(*waiting), 1.0)
        assert backend.in_flight == 0
        for e in entries:
            e.done()

    asyncio.run(scenario())
