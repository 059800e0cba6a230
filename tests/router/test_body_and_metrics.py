"""The router forwards the client's bytes, counts every response in parseable metrics,
reports each engine's current state, and relays GET /v1/models/{id}."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from relaykv.router.app import create_router_app
from relaykv.router.intake import ClientBody
from relaykv.router.relay import Router

from .test_relay import D1, P1, Engines, _client


class RawEngines(Engines):
    """`Engines` that also keep each request's raw bytes."""

    def __init__(self, **behaviour: str) -> None:
        super().__init__(**behaviour)
        self.raw: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.raw.append(request.content)
        if request.url.path.startswith("/v1/models"):
            return httpx.Response(200, json={"id": request.url.path.rsplit("/", 1)[-1]})
        return super().__call__(request)


def test_with_fields_keeps_the_client_bytes_and_the_last_value_wins() -> None:
    raw = b'{"prompt": [1, 2],  "x": 1e309, "s": "\\ud800", "n": 123456789012345678901234567890}\n'
    body = ClientBody.parse(raw)
    out = body.with_fields({"max_tokens": 1, "s": "ok"})
    assert out.startswith(raw.rstrip()[:-1])  # every client byte, in order
    parsed = json.loads(out)
    assert parsed["max_tokens"] == 1 and parsed["s"] == "ok"
    assert parsed["n"] == 123456789012345678901234567890 and parsed["x"] == float("inf")
    assert json.loads(ClientBody.parse(b"{ }").with_fields({"a": 1})) == {"a": 1}
    assert ClientBody.parse(raw).with_fields({}) == raw
    # Not UTF-8 text around the object (UTF-16): re-encoded as ASCII JSON, values intact.
    utf16 = json.dumps({"prompt": "h\u00e9"}).encode("utf-16")
    reencoded = json.loads(ClientBody.parse(utf16).with_fields({"a": 1}))
    assert reencoded == {"prompt": "h\u00e9", "a": 1}


async def test_bodies_are_forwarded_as_received() -> None:
    engines = RawEngines()
    router = Router([P1], [D1])
    raw = b'{"model": "m", "prompt": "a\\ud800", "max_tokens": 5, "temperature": Infinity}'
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", content=raw)
    assert resp.status_code == 200
    prefill, decode = engines.raw
    assert prefill.startswith(raw[:-1]) and decode.startswith(raw[:-1])
    assert json.loads(prefill)["kv_transfer_params"]["do_remote_decode"] is True
    assert json.loads(decode)["max_tokens"] == 5


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


async def test_metrics_parse_typed_and_count_every_response() -> None:
    router = Router([P1], [D1], api_key="k")
    auth = {"Authorization": "Bearer k"}

    def broken_prompt(body: dict) -> None:
        raise RuntimeError("routing bug")

    router.client = httpx.AsyncClient(transport=httpx.MockTransport(RawEngines()))
    # As a server does: an unexpected exception becomes the error handler's 500 response.
    transport = httpx.ASGITransport(app=create_router_app(router), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        assert (await client.post("/v1/completions", json={"prompt": [1]})).status_code == 401
        ok = await client.post("/v1/completions", json={"prompt": [1]}, headers=auth)
        assert ok.status_code == 200
        bad = await client.post("/v1/completions", content=b"{", headers=auth)
        assert bad.status_code == 400
        router.routing.prompts.prompt = broken_prompt  # type: ignore[method-assign]
        own = await client.post("/v1/completions", json={"prompt": [1]}, headers=auth)
        assert own.status_code == 500 and own.json()["error"]["type"] == "server_error"
        assert (await client.get("/nothing")).status_code == 404
        text = (await client.get("/metrics")).text
    families = _families(text)
    assert all(f.type != "unknown" for f in families.values()), text
    responses = {
        (s.labels["endpoint"], s.labels["status"]): s.value
        for s in families["relaykv:router_responses"].samples
        if s.name.endswith("_total")
    }
    assert responses == {
        ("/v1/completions", "401"): 1,
        ("/v1/completions", "200"): 1,
        ("/v1/completions", "400"): 1,
        ("/v1/completions", "500"): 1,
        ("other", "404"): 1,
    }
    requests = families["relaykv:router_requests"]
    assert requests.type == "counter" and requests.samples[0].value == 4
    healthy = {s.labels["url"]: s.value for s in families["relaykv:router_engine_healthy"].samples}
    assert healthy == {P1: 1.0, D1: 1.0}
    streams = {s.labels["url"]: s.value for s in families["relaykv:router_engine_streams"].samples}
    assert streams == {P1: 0.0, D1: 0.0}  # every answer has ended


async def test_health_reports_the_current_state() -> None:
    engines = RawEngines(**{D1: "down"})
    router = Router([P1], [D1])
    async with _client(router, engines) as client:
        assert router.client is not None
        await router.decode.check(router.client)
        down = (await client.get("/health")).json()["decode"][0]
        assert not down["healthy"] and "ConnectError" in down["last_error"]
        engines.behaviour[D1] = "ok"
        await router.decode.check(router.client)
        health = await client.get("/health")
    assert health.status_code == 200
    now = health.json()["decode"][0]
    assert now["healthy"] and now["last_error"] == ""  # no stale startup error
    assert "ConnectError" in now["last_failure"] and now["seconds_since_check"] is not None


async def test_model_by_id_is_relayed() -> None:
    router = Router([P1], [D1])
    async with _client(router, RawEngines()) as client:
        resp = await client.get("/v1/models/tiny-hybrid")
    assert resp.status_code == 200 and resp.json() == {"id": "tiny-hybrid"}


async def test_routing_records_are_behind_the_api_key() -> None:
    """`/routing` lists per-request records: with a key set, only its holders read them
    (docs/security.md, "Listeners"); `/health`, `/cluster` and `/metrics` stay open."""
    router = Router([P1], [D1], api_key="k")
    transport = httpx.ASGITransport(app=create_router_app(router))
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        denied = await client.get("/routing?recent=1")
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        wrong = await client.get("/routing", headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401
        ok = await client.get("/routing?recent=1", headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200 and "engines" in ok.json()
        assert (await client.get("/cluster")).status_code == 200
    open_router = Router([P1], [D1])
    transport = httpx.ASGITransport(app=create_router_app(open_router))
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        assert (await client.get("/routing")).status_code == 200
