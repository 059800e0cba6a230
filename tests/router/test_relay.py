"""The P/D router against mock engines (httpx MockTransport): the two-hop flow, least-loaded
choice, failover, 503 when nothing is left, relayed client errors, streaming, the API key."""

from __future__ import annotations

import json

import httpx
import pytest

from relaykv.router.backends import BackendPool
from relaykv.router.relay import Router, create_router_app

TRANSFER = {"do_remote_prefill": True, "remote_request_id": "p-1", "source": {}}


class Engines:
    """Mock engines by URL: `behaviour[url]` is `ok`, `down`, `500`, `400` or `503`."""

    def __init__(self, **behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content) if request.content else {}
        self.calls.append((url, body))
        what = self.behaviour.get(url, "ok")
        if what == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if what in ("500", "503"):
            return httpx.Response(int(what), json={"error": {"message": "broken"}})
        if what == "400":
            return httpx.Response(
                400, json={"error": {"message": "prompt too long", "param": "prompt"}}
            )
        if body.get("kv_transfer_params", {}).get("do_remote_decode"):
            return httpx.Response(
                200, json={"choices": [{"text": "x"}], "kv_transfer_params": TRANSFER}
            )
        if body.get("stream"):
            return httpx.Response(
                200, content=_sse(), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json={"choices": [{"text": "decoded"}], "from": url})


async def _sse():
    yield b'data: {"choices": [{"text": "a"}]}\n\n'
    yield b"data: [DONE]\n\n"


def _client(router: Router, engines: Engines) -> httpx.AsyncClient:
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(engines))
    app = create_router_app(router)  # lifespan not run: the mock client stays
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router")


P1, P2, D1, D2 = ("http://p1:1", "http://p2:1", "http://d1:1", "http://d2:1")
BODY = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5, "stream_options": {"x": 1}}


async def test_two_hops_prefill_then_decode() -> None:
    engines = Engines()
    router = Router([P1], [D1])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "decoded"
    (p_url, p_body), (d_url, d_body) = engines.calls
    assert (p_url, d_url) == (P1, D1)
    # P validates the client's max_tokens as D will (and generates one token anyway)
    assert p_body["max_tokens"] == 5 and not p_body["stream"] and p_body["stream_options"] is None
    assert p_body["kv_transfer_params"] == {"do_remote_decode": True}
    assert d_body["kv_transfer_params"] == TRANSFER and d_body["max_tokens"] == 5


async def test_failed_engines_leave_the_rotation_and_the_request_is_retried() -> None:
    engines = Engines(**{P1: "down", D1: "500"})
    router = Router([P1, P2], [D1, D2])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
        assert resp.status_code == 200 and resp.json()["from"] == D2
        assert [b.healthy for b in router.prefill.backends] == [False, True]
        assert [b.healthy for b in router.decode.backends] == [False, True]
        assert router.stats.retries == 2
        health = await client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize("broken", ["down", "500", "503"])
async def test_no_engine_left_is_a_503_with_an_openai_error(broken: str) -> None:
    router = Router([P1], [D1])
    async with _client(router, Engines(**{P1: broken})) as client:
        resp = await client.post("/v1/completions", json=BODY)
        assert resp.status_code == 503
        assert "no prefill engine" in resp.json()["error"]["message"]
        assert (await client.get("/health")).status_code == 503


async def test_client_errors_are_relayed_unchanged() -> None:
    router = Router([P1], [D1])
    async with _client(router, Engines(**{P1: "400"})) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
    assert router.prefill.backends[0].healthy  # the request was bad, not the engine


async def test_streams_are_relayed() -> None:
    router = Router([P1], [D1])
    async with _client(router, Engines()) as client:
        resp = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    assert router.decode.backends[0].in_flight == 0


async def test_api_key_and_malformed_bodies() -> None:
    router = Router([P1], [D1], api_key="k")
    async with _client(router, Engines()) as client:
        assert (await client.post("/v1/completions", json=BODY)).status_code == 401
        ok = await client.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200
        bad = await client.post(
            "/v1/completions", content=b"{nope", headers={"Authorization": "Bearer k"}
        )
        assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
        listed = await client.post(
            "/v1/completions", json=[1], headers={"Authorization": "Bearer k"}
        )
        assert listed.status_code == 400


async def test_cluster_lists_the_engines() -> None:
    router = Router([P1], [D1, D2], public_url="http://router:9")
    async with _client(router, Engines()) as client:
        assert (await client.get("/cluster")).json() == {
            "router": "http://router:9",
            "prefill": [P1],
            "decode": [D1, D2],
        }


def test_least_loaded_then_round_robin() -> None:
    pool = BackendPool("decode", [D1, D2])
    a, b = pool.backends
    a.in_flight = 2
    assert pool.pick() is b
    b.in_flight = 2
    assert {pool.pick().url, pool.pick().url} == {D1, D2}
    assert pool.pick(exclude={a, b}) is None
    with pytest.raises(ValueError):
        BackendPool("prefill", [])
