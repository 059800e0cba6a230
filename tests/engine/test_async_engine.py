from __future__ import annotations

import asyncio

import pytest

from relaykv.engine import AsyncEngine, InvalidRequest

from .conftest import HYBRID, greedy, make_engine, prompt
from .reference_executor import reference_generate


async def _collect(engine: AsyncEngine, rid: str, p: list[int], n: int) -> list[int]:
    tokens: list[int] = []
    async for out in engine.generate(rid, p, greedy(n)):
        tokens.extend(out.new_token_ids)
    return tokens


async def test_concurrent_streams_are_exact() -> None:
    engine = AsyncEngine(make_engine())
    await engine.start()
    prompts = [prompt(10 + 13 * i, seed=i) for i in range(8)]
    jobs = (_collect(engine, f"r{i}", p, 12) for i, p in enumerate(prompts))
    results = await asyncio.gather(*jobs)
    for p, got in zip(prompts, results, strict=True):
        assert got == reference_generate(HYBRID, p, 12)
    await engine.shutdown(drain_timeout=1)


async def test_cancelled_consumer_aborts_and_frees() -> None:
    sync = make_engine()
    engine = AsyncEngine(sync)
    await engine.start()

    stream = engine.generate("long", prompt(50, 1), greedy(400))
    first = await stream.__anext__()
    assert first.new_token_ids and not first.finished
    await stream.aclose()  # what a client disconnect does to the handler's iteration
    for _ in range(100):
        if sync.manager.pool.num_free == sync.manager.pool.num_usable and not sync.has_unfinished():
            break
        await asyncio.sleep(0.01)
    assert sync.manager.pool.num_free == sync.manager.pool.num_usable
    await engine.shutdown(drain_timeout=1)


async def test_invalid_request_raises_before_streaming() -> None:
    engine = AsyncEngine(make_engine())
    await engine.start()
    with pytest.raises(InvalidRequest):
        async for _ in engine.generate("bad", [], greedy(3)):
            pass
    assert await _collect(engine, "ok", [1, 2, 3], 2) == reference_generate(HYBRID, [1, 2, 3], 2)
    await engine.shutdown(drain_timeout=1)


async def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving() -> None:
    sync = make_engine()
    real = sync.executor.execute
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(batch)

    sync.executor.execute = flaky
    engine = AsyncEngine(sync)
    await engine.start()
    outs = [out async for out in engine.generate("a", prompt(20, 1), greedy(10))]
    assert outs[-1].finished and outs[-1].finish_reason == "error" and "boom" in outs[-1].error
    assert sync.manager.pool.num_free == sync.manager.pool.num_usable
    assert await _collect(engine, "b", [1, 2, 3], 3) == reference_generate(HYBRID, [1, 2, 3], 3)
    assert engine.dead is None
    await engine.shutdown(drain_timeout=1)
