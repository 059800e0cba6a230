"""The router's limits (413, 408, 400 for malformed JSON), `data: [DONE]` on every stream,
draining, and client disconnects cancelling the engine call (mock engines)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from relaykv.router.app import create_router_app
from relaykv.router.intake import IntakeLimits
from relaykv.router.relay import Router

from .test_relay import BODY, D1, P1, Engines, _client


@pytest.mark.parametrize(
    "raw, status, words",
    [
        (b"[" * 100_000 + b"]" * 100_000, 400, "malformed JSON"),
        (b'{"prompt": "x", ', 400, "malformed JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"prompt": "' + b"a" * (1 << 20) + b'"}', 413, "limit of 1048576 bytes"),
    ],
    ids=["deep-array", "truncated", "not-object", "too-large"],
)
async def test_bad_bodies_get_4xx_and_reach_no_engine(raw: bytes, status: int, words: str) -> None:
    """(A lone surrogate or `Infinity` is the engine's to refuse: the router forwards the
    client's bytes, tests/router/test_body_and_metrics.py; the chaos suite sends one end to end.)"""
    engines = Engines()
    router = Router([P1], [D1], limits=IntakeLimits(max_body_bytes=1 << 20))
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", content=raw,
                                 headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    assert words in resp.json()["error"]["message"]
    assert engines.calls == []
    assert router.in_flight == 0


async def test_a_body_without_content_length_is_cut_at_the_limit() -> None:
    engines = Engines()
    router = Router([P1], [D1], limits=IntakeLimits(max_body_bytes=1000))

    async def chunks():
        for _ in range(10):
            yield b"a" * 500

    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", content=chunks())
    assert resp.status_code == 413 and engines.calls == []


async def test_a_slow_body_gets_408() -> None:
    router = Router([P1], [D1], limits=IntakeLimits(body_timeout_s=0.2))

    async def slow():
        yield b'{"prompt": '
        await asyncio.sleep(2)
        yield b'"x"}'

    async with _client(router, Engines()) as client:
        resp = await client.post("/v1/completions", content=slow())
    assert resp.status_code == 408


class BrokenStream(Engines):
    """D's stream sends one event, then (`how`) breaks or ends without [DONE]."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if not body.get("stream"):
            return super().__call__(request)

        async def events():
            yield b'data: {"choices": [{"text": "a"}]}\n\n'
            if self.how == "break":
                raise httpx.ReadError("connection reset by peer")

        return httpx.Response(200, content=events(), headers={"content-type": "text/event-stream"})


@pytest.mark.parametrize("how", ["break", "early-end"])
async def test_every_stream_ends_with_done(how: str) -> None:
    router = Router([P1], [D1])
    async with _client(router, BrokenStream(how)) as client:
        resp = await client.post("/v1/completions", json={**BODY, "stream": True})
    events = [e for e in resp.text.split("\n\n") if e]
    assert events[0].startswith('data: {"choices"')
    assert '"error"' in events[1]
    assert events[-1] == "data: [DONE]"
    assert router.in_flight == 0
    d1 = router.decode.backends[0]
    assert (d1.in_flight, d1.streams) == (0, 0)  # a broken stream is counted out too


async def test_a_draining_router_refuses_new_requests() -> None:
    router = Router([P1], [D1])
    router.draining = True
    async with _client(router, Engines()) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "draining"


async def test_client_disconnect_cancels_the_engine_call() -> None:
    """A non-streaming request whose client leaves: the router cancels its engine call."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hung_prefill(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/kv_cache_info":  # D's engine id (router/destinations.py)
            return httpx.Response(200, json={"engine_id": "d1"})
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return httpx.Response(500)

    router = Router([P1], [D1])
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(hung_prefill))
    app = create_router_app(router)
    body = json.dumps(BODY).encode()
    sent = []

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await started.wait()
        return {"type": "http.disconnect"}  # the client goes away mid-prefill

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }
    await asyncio.wait_for(app(scope, receive, send), 10)
    assert cancelled.is_set()
    assert router.in_flight == 0
    assert [m["status"] for m in sent[1:] if m.get("type") == "http.response.start"] == [499]


def test_a_text_prompt_the_tokenizer_cannot_take_is_routed_not_a_500() -> None:
    """A lone surrogate reaches the engine (its 400 to give), never a router 500."""
    from relaykv.router.policy import CacheAwareWeights
    from relaykv.router.routing import Routing

    class Refusing:
        def encode(self, text: str, add_special_tokens: bool = True):
            raise TypeError("TextInputSequence must be str")

    routing = Routing("cache-aware", CacheAwareWeights())
    routing.prompts._tokenizer = Refusing()
    assert routing.prompts.prompt({"prompt": "\ud800"}) is None
