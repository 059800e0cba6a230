"""router/engine_calls.py: every call to an engine counts on it (`in_flight`, and `streams`
for a request that decodes) only while it runs: a call that is cancelled (its client task
stopped) or fails in an unexpected way while the engine's answer is awaited gives its counts
back, streamed or not. A count left behind would keep the engine looking busy for good (the
conditional rule sends no local request to a decode engine with streams)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from relaykv.router.backends import BackendPool
from relaykv.router.engine_calls import EngineCalls
from relaykv.router.metrics import RouterStats

URL = "http://d1:8000"


class Unanswered:
    """An engine that takes the request and never answers; `seen` once it has it."""

    def __init__(self) -> None:
        self.seen = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def _calls(handler: object) -> tuple[EngineCalls, BackendPool, list[str]]:
    ended: list[str] = []
    calls = EngineCalls(httpx.Timeout(5.0), RouterStats(), lambda: ended.append("end"))
    calls.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))  # type: ignore[arg-type]
    return calls, BackendPool("decode", [URL]), ended


@pytest.mark.parametrize("stream", [True, False])
async def test_a_cancelled_call_gives_its_counts_back(stream: bool) -> None:
    engine = Unanswered()
    calls, pool, _ = _calls(engine)
    backend = pool.backends[0]
    task = asyncio.create_task(
        calls.decode(pool, backend, "/v1/completions", b"{}", {}, stream, decodes=True)
    )
    await asyncio.wait_for(engine.seen.wait(), 5)
    assert (backend.in_flight, backend.streams) == (1, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (backend.in_flight, backend.streams) == (0, 0)
    assert calls.client is not None
    await calls.client.aclose()


@pytest.mark.parametrize("stream", [True, False])
async def test_an_unexpected_error_gives_the_counts_back(stream: bool) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("not an HTTP error")

    calls, pool, _ = _calls(broken)
    backend = pool.backends[0]
    with pytest.raises(RuntimeError, match="not an HTTP error"):
        await calls.decode(pool, backend, "/v1/completions", b"{}", {}, stream, decodes=True)
    assert (backend.in_flight, backend.streams) == (0, 0)
    assert calls.client is not None
    await calls.client.aclose()
