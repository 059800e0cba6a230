"""The P/D router against mock engines (httpx MockTransport): the two-hop flow, least-loaded
choice, failover, 503 when nothing is left, relayed client errors, streaming, the API key."""

from __future__ import annotations

import json

import httpx
import pytest

from relaykv.router.app import create_router_app
from relaykv.router.backends import BackendPool
from relaykv.router.relay import Router
from relaykv.router.routing import Routing

TRANSFER = {"do_remote_prefill": True, "remote_request_id": "p-1", "source": {}}


def engine_id(url: str) -> str:
    return "engine-" + url.split("//")[1].split(":")[0]


class Engines:
    """Mock engines by URL: `behaviour[url]` is `ok`, `down`, `500`, `400` or `503`. Each
    reports `engine_id(url)` at /v1/kv_cache_info (those calls are in `info_calls`)."""

    def __init__(self, **behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[tuple[str, dict]] = []
        self.info_calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        what = self.behaviour.get(url, "ok")
        if what == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/kv_cache_info":
            self.info_calls.append(url)
            return httpx.Response(200, json={"engine_id": engine_id(url)})
        body = json.loads(request.content) if request.content else {}
        self.calls.append((url, body))
        if what in ("500", "503"):
            return httpx.Response(int(what), json={"error": {"message": "broken"}})
        if what == "400":
            return httpx.Response(
                400, json={"error": {"message": "prompt too long", "param": "prompt"}}
            )
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
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
    # P's grant is for the decode engine chosen first (docs/security.md)
    assert p_body["kv_transfer_params"] == {
        "do_remote_decode": True, "destination_engine_id": engine_id(D1)
    }
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
    routing = Routing("least-loaded")
    pool = BackendPool("decode", [D1, D2])
    a, b = pool.backends

    def pick(tried: set | None = None) -> object:
        choice = routing.pick(pool, tried or set(), None)
        return None if choice is None else choice.backend

    a.in_flight = 2
    assert pick() is b
    b.in_flight = 2
    assert {pick().url, pick().url} == {D1, D2}  # type: ignore[attr-defined]
    assert pick({a, b}) is None
    with pytest.raises(ValueError):
        BackendPool("prefill", [])


class RestartingEngines(Engines):
    """P's grant names the destination it was asked for; D refuses a grant for another id
    (400 naming kv_transfer_params), as a real D does; `restart(url)` gives D a new id."""

    def __init__(self, **behaviour: str) -> None:
        super().__init__(**behaviour)
        self.ids: dict[str, str] = {}

    def restart(self, url: str) -> None:
        self.ids[url] = engine_id(url) + "-restarted"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if self.behaviour.get(url) == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/kv_cache_info":
            self.info_calls.append(url)
            return httpx.Response(200, json={"engine_id": self.ids.get(url, engine_id(url))})
        body = json.loads(request.content)
        grant = body.get("kv_transfer_params", {})
        if grant.get("do_remote_decode"):
            self.calls.append((url, body))
            transfer = {**TRANSFER, "destination_engine_id": grant.get("destination_engine_id")}
            return httpx.Response(200, json={"kv_transfer_params": transfer})
        if grant.get("destination_engine_id") != self.ids.get(url, engine_id(url)):
            self.calls.append((url, body))
            return httpx.Response(400, json={"error": {
                "message": "kv_transfer_params were issued for another engine",
                "param": "kv_transfer_params"}})
        return super().__call__(request)


def _destinations(engines: Engines) -> list[str]:
    return [
        b["kv_transfer_params"]["destination_engine_id"]
        for _, b in engines.calls
        if b["kv_transfer_params"].get("do_remote_decode")
    ]


async def test_a_failed_decode_engine_gets_no_grant_meant_for_it_and_the_next_a_fresh_one() -> None:
    engines = RestartingEngines(**{D1: "500"})
    router = Router([P1], [D1, D2])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and resp.json()["from"] == D2
    # P computed twice: once for D1 (which failed), once with a grant for D2
    assert _destinations(engines) == [engine_id(D1), engine_id(D2)]
    assert [b.in_flight for b in router.decode.backends] == [0, 0]
    assert router.decode.backends[0].engine_id is None  # forgotten with the failure


async def test_an_unreachable_decode_engine_is_found_before_prefill() -> None:
    engines = RestartingEngines(**{D1: "down"})
    router = Router([P1], [D1, D2])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and resp.json()["from"] == D2
    assert _destinations(engines) == [engine_id(D2)]  # no prefill was spent on D1


async def test_a_restarted_decode_engine_gets_a_grant_for_its_new_id() -> None:
    engines = RestartingEngines()
    router = Router([P1], [D1])
    async with _client(router, engines) as client:
        assert (await client.post("/v1/completions", json=BODY)).status_code == 200
        engines.restart(D1)  # between two health checks: the router still has the old id
        resp = await client.post("/v1/completions", json={**BODY, "stream": True})
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    assert _destinations(engines) == [engine_id(D1)] * 2 + [engine_id(D1) + "-restarted"]
    assert router.decode.backends[0].engine_id == engine_id(D1) + "-restarted"


class RefusingEngines(RestartingEngines):
    """D refuses every grant (say, expired) while its id stays the same."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if body.get("kv_transfer_params", {}).get("do_remote_prefill"):
            return httpx.Response(400, json={"error": {
                "message": "expired", "param": "kv_transfer_params"}})
        return super().__call__(request)


async def test_a_grant_refused_for_another_reason_is_relayed_without_a_retry() -> None:
    engines = RefusingEngines()
    router = Router([P1], [D1])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "expired"
    assert _destinations(engines) == [engine_id(D1)]  # the same id when asked again
    assert engines.info_calls == [D1, D1]
