"""A client that goes away mid-request has its request aborted and its blocks freed."""

from __future__ import annotations

import socket
import time

import httpx

from relaykv.kvcache import assert_consistent

from ..harness import API_KEY, ServerThread

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _running(server: ServerThread) -> int:
    return len(server.served.engine.scheduler.running)


def _aborts(server: ServerThread) -> int:
    return server.served.engine.metrics.requests_finished.get("abort", 0)


def test_stream_disconnect_aborts_and_frees(server: ServerThread) -> None:
    server.executor.delay = 0.01  # 440 steps: >= 4.4 s of generation left to interrupt
    aborts = _aborts(server)
    body = {"prompt": list(range(1, 60)), "max_tokens": 440, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c,
        c.stream("POST", "/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert '"text"' in first
        engine = server.served.engine
        state = (engine.manager.pool.num_free, _running(server), engine.metrics.requests_finished)
        assert state[0] < engine.manager.pool.num_usable and state[1] == 1, state
    # leaving the block closed the connection
    assert server.idle(), "the aborted request's blocks were not freed"
    assert _aborts(server) == aborts + 1
    assert_consistent(server.served.engine.manager)


def test_non_streaming_disconnect_aborts_and_frees(server: ServerThread) -> None:
    server.executor.delay = 0.005
    aborts = _aborts(server)
    payload = b'{"prompt": [1,2,3,4,5,6,7,8,9], "max_tokens": 400, "ignore_eos": true}'
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        deadline = time.monotonic() + 5
        while _running(server) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _running(server) == 1
    assert server.idle(), "the aborted request's blocks were not freed"
    assert _aborts(server) == aborts + 1
