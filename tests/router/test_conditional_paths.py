"""The local path of conditional disaggregation against mock engines (router/relay.py): a
local request reaches D alone, without transfer parameters; a D that refuses it for its pool
(429, `local_admission_refused`) gets it again through P; a D that fails takes nothing more
and the request goes through P to another D; under `never` it goes to another D alone. Each
path is in the decision records, as is a D too busy with this router's requests to take one."""

from __future__ import annotations

import json

import httpx

from relaykv.common.messages.api_errors import LOCAL_ADMISSION_REFUSED
from relaykv.router.policy import ConditionalRule, PathChoice
from relaykv.router.relay import Router
from relaykv.router.routing import Routing

from .test_relay import BODY, D1, D2, P1, Engines, _client


class LocalEngines(Engines):
    """`Engines`, plus `refuse` (429 for a local request) and `local-down` (a local
    request's connection fails) behaviours."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        what = self.behaviour.get(url, "ok")
        body = json.loads(request.content) if request.content else {}
        local = request.url.path.startswith("/v1/") and body.get("kv_transfer_params", 0) is None
        if local and what == "refuse":
            self.calls.append((url, body))
            error = {"message": "pool full", "code": LOCAL_ADMISSION_REFUSED}
            return httpx.Response(429, json={"error": error})
        if local and what == "local-down":
            self.calls.append((url, body))
            raise httpx.ReadError("connection reset", request=request)
        if what in ("refuse", "local-down"):
            self.behaviour = {**self.behaviour, url: "ok"}
            try:
                return super().__call__(request)
            finally:
                self.behaviour = {**self.behaviour, url: what}
        return super().__call__(request)


class AlwaysLocal(ConditionalRule):
    """The conditional rule with every decision local (the mocks have no KV events)."""

    def decide(
        self, prompt_tokens: int, hit_tokens: int | None, queued: int, running: int = 0
    ) -> PathChoice:
        return PathChoice(True, 3, "test: local")


class HeldPrefix(ConditionalRule):
    """The conditional rule as if D held all but the last 3 tokens of a 100-token prompt
    (the mocks' router reads no prompt)."""

    def decide(
        self, prompt_tokens: int, hit_tokens: int | None, queued: int, running: int = 0
    ) -> PathChoice:
        return super().decide(100, 97, queued, running)


def _router(rule: ConditionalRule, decode: list[str]) -> Router:
    return Router([P1], decode, routing=Routing("least-loaded", conditional=rule))


def _paths(router: Router) -> list[tuple[str, str, str]]:
    return [(d.role, d.engine, d.path) for d in router.routing.recent]


async def test_never_sends_the_request_to_the_decode_engine_alone() -> None:
    engines = LocalEngines()
    router = _router(ConditionalRule("never"), [D1])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and resp.json()["from"] == D1
    ((url, body),) = engines.calls
    assert url == D1 and body["kv_transfer_params"] is None and body["stream_options"]
    assert _paths(router) == [("decode", D1, "local")]
    assert router.routing.recent[0].why == "--disaggregation never"
    assert router.routing.in_flight.queued_prefill(D1) == 0  # answered: nothing queued


async def test_a_refused_local_request_goes_through_p_to_the_same_engine() -> None:
    engines = LocalEngines(**{D1: "refuse"})
    router = _router(ConditionalRule("never"), [D1])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and resp.json()["from"] == D1
    assert [u for u, _ in engines.calls] == [D1, P1, D1]
    assert engines.calls[1][1]["kv_transfer_params"]["do_remote_decode"]
    assert engines.calls[2][1]["kv_transfer_params"]["do_remote_prefill"]
    assert _paths(router) == [("decode", D1, "local"), ("decode", D1, "pd"), ("prefill", P1, "pd")]
    assert "refused it locally" in router.routing.recent[1].why
    assert router.decode.backends[0].healthy  # a refusal is not a failure


async def test_a_failed_decode_engine_gets_nothing_more_the_request_goes_through_p() -> None:
    engines = LocalEngines(**{D1: "local-down"})
    router = _router(AlwaysLocal(), [D1, D2])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
        assert resp.status_code == 200 and resp.json()["from"] == D2
        assert [u for u, _ in engines.calls] == [D1, P1, D2]
        assert not router.decode.backends[0].healthy
        record = router.routing.recent[1]
        assert (record.engine, record.path) == (D2, "pd") and "local attempt" in record.why
        # The next request: D1 is out of rotation, so D2 takes it, locally.
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and engines.calls[-1][0] == D2
    assert _paths(router)[-1] == ("decode", D2, "local")


async def test_under_never_a_failed_local_attempt_moves_to_another_decode_engine() -> None:
    engines = LocalEngines(**{D1: "local-down"})
    router = _router(ConditionalRule("never"), [D1, D2])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and resp.json()["from"] == D2
    assert [u for u, _ in engines.calls] == [D1, D2]  # P is never called
    assert _paths(router) == [("decode", D1, "local"), ("decode", D2, "local")]


async def test_a_decode_engine_running_requests_of_this_router_gets_siblings_through_p() -> None:
    engines = LocalEngines()
    router = _router(HeldPrefix(max_running=1), [D1])
    d1 = router.decode.backends[0]
    async with _client(router, engines) as client:
        d1.in_flight = 1  # one stream there: a local prefill may hold it up one step
        assert (await client.post("/v1/completions", json=BODY)).status_code == 200
        d1.in_flight = 2  # two: P computes, D only loads
        assert (await client.post("/v1/completions", json=BODY)).status_code == 200
    assert [u for u, _ in engines.calls] == [D1, P1, D1]
    assert engines.calls[0][1]["kv_transfer_params"] is None
    assert _paths(router) == [("decode", D1, "local"), ("decode", D1, "pd"), ("prefill", P1, "pd")]
    assert router.routing.recent[1].why == "2 requests running there > max running 1"


async def test_a_streamed_local_request_is_relayed() -> None:
    engines = LocalEngines()
    router = _router(ConditionalRule("never"), [D1])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json={**BODY, "stream": True})
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    assert [u for u, _ in engines.calls] == [D1]
