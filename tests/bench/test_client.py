"""The streaming client against loopback stub servers: timings, usage, every failure mode."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from relaykv.bench.client import ApiTarget, build_payload, send_request
from relaykv.bench.runner import LoadShape, new_session, run_requests
from relaykv.common.workloads import SampleRequest, prefix_repetition_requests
from relaykv.common.workloads.arrivals import arrival_offsets
from tests.bench.stub_cluster import EngineState, ServerThread


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(EngineState(token_delay_s=0.002)) as srv:
        yield srv


def target(srv: ServerThread, path: str = "/v1/completions", **kw) -> ApiTarget:
    return ApiTarget(api_url=srv.url + path, model="stub-model", chat="chat" in path, **kw)


async def send(t: ApiTarget, req: SampleRequest):
    async with new_session(None) as session:
        return await send_request(session, t, req)


async def test_success_records_timings_usage_and_cached_tokens(server: ServerThread) -> None:
    req = SampleRequest(list(range(40)), 5)
    first = await send(target(server), req)
    assert first.success and first.error == ""
    assert (first.prompt_len, first.output_tokens, first.cached_tokens) == (40, 5, 0)
    assert len(first.itl) == 4 and all(gap >= 0 for gap in first.itl)
    assert 0 < first.ttft <= first.latency
    assert first.latency == pytest.approx(first.ttft + sum(first.itl))
    assert first.generated_text == "t0 t1 t2 t3 t4 "
    second = await send(target(server), req)
    assert second.cached_tokens == 32  # (40 - 1) // 16 * 16 blocks cached by the first


async def test_payload_shape(server: ServerThread) -> None:
    t = target(server, sampling={"temperature": 0.0}, ignore_eos=True)
    await send(t, SampleRequest([1, 2, 3], 2))
    body = server.state.received[-1]
    assert body == {
        "model": "stub-model",
        "prompt": [1, 2, 3],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,
    }


async def test_chat_endpoint_sends_messages(server: ServerThread) -> None:
    out = await send(target(server, "/v1/chat/completions"), SampleRequest([1, 2], 3, "hi there"))
    assert out.success and out.output_tokens == 3 and out.generated_text == "t0 t1 t2 "
    assert len(out.itl) == 2  # the opening role-only chunk is not a token
    body = server.state.received[-1]
    assert body["messages"] == [{"role": "user", "content": "hi there"}]
    assert body["max_completion_tokens"] == 3
    with pytest.raises(ValueError, match="text"):
        build_payload(target(server, "/v1/chat/completions"), SampleRequest([1], 1))


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("http_error", "HTTP 500"),
        ("bad_chunk", "not JSON"),
        ("error_event", "engine died"),
        ("drop", "ClientPayloadError"),
        ("no_done", "before data: [DONE]"),
        ("stall", "timeout after 0.5 s"),
    ],
)
async def test_failures_are_recorded_not_raised(mode: str, error: str) -> None:
    with ServerThread(EngineState(behaviour=lambda n, body: mode)) as srv:
        out = await send(target(srv, timeout_s=0.5), SampleRequest(list(range(20)), 4))
    assert not out.success
    assert error in out.error
    assert out.output_tokens == 0


async def test_close_delimited_stream_cut_short_fails() -> None:
    """An HTTP/1.0-style body (ended by closing the socket) that stops mid-stream."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Connection: close\r\n\r\n"
            b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        t = ApiTarget(api_url=f"http://127.0.0.1:{port}/v1/completions", model="m")
        out = await send(t, SampleRequest([1, 2], 2))
    finally:
        server.close()
        await server.wait_closed()
    assert not out.success and "[DONE]" in out.error


async def test_connection_refused_is_a_failure() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    out = await send(
        ApiTarget(api_url=f"http://127.0.0.1:{port}/v1/completions", model="m"),
        SampleRequest([1], 1),
    )
    assert not out.success and "ClientConnectorError" in out.error


async def test_run_counts_failures_and_caps_concurrency() -> None:
    modes = {2: "http_error", 5: "drop", 7: "bad_chunk"}
    state = EngineState(token_delay_s=0.003, behaviour=lambda n, body: modes.get(n, "ok"))
    with ServerThread(state) as srv:
        reqs = prefix_repetition_requests(
            12, 1000, prefix_len=32, suffix_len=8, num_prefixes=1, output_len=4
        )
        run = await run_requests(
            target(srv), reqs, LoadShape(max_concurrency=3, num_warmups=1), progress=False
        )
    assert len(run.warmup_outcomes) == 1 and run.warmup_outcomes[0].success
    assert len(run.outcomes) == 12
    assert sum(o.success for o in run.outcomes) == 9  # n = 2, 5, 7 failed (n = 0 was warmup)
    assert state.received[0]["prompt"] == reqs[0].prompt_ids  # the warmup is request 0
    assert run.duration_s > 0


async def test_max_concurrency_is_respected() -> None:
    state = EngineState(token_delay_s=0.003)
    with ServerThread(state) as srv:
        reqs = [SampleRequest(list(range(i, i + 20)), 4) for i in range(10)]
        await run_requests(target(srv), reqs, LoadShape(max_concurrency=3), progress=False)
        assert state.max_inflight == 3
        state.max_inflight = 0
        await run_requests(target(srv), reqs, LoadShape(), progress=False)
        assert state.max_inflight > 3


async def test_poisson_arrivals_spread_requests_out() -> None:
    with ServerThread(EngineState()) as srv:
        reqs = [SampleRequest([1, 2, 3], 1) for _ in range(5)]
        run = await run_requests(
            target(srv), reqs, LoadShape(request_rate=50.0, seed=1), progress=False
        )
    starts = sorted(o.start_time for o in run.outcomes)
    planned = arrival_offsets(5, 50.0, 1.0, seed=1)
    assert starts[-1] - starts[0] == pytest.approx(planned[-1] - planned[0], abs=0.03)
    assert run.duration_s >= planned[-1]
