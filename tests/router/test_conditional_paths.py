"""The local path of conditional disaggregation against mock engines (router/relay.py): a
local request reaches D alone, without transfer parameters; a D that refuses it for its pool
(429, `local_admission_refused`) gets it again through P; a D that fails takes nothing more
and the request goes through P to another D; under `never` it goes to another D alone. Each
path is in the decision records, as is a D that decodes streams of this router (requests
asking for more than one token, counted until their answer ends), which takes no local one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx

from relaykv.common.messages.api_errors import LOCAL_ADMISSION_REFUSED
from relaykv.router.intake import ClientBody
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
        self, prompt_tokens: int, hit_tokens: int | None, queued: int, streams: int = 0
    ) -> PathChoice:
        return PathChoice(True, 3, "test: local")


class HeldPrefix(ConditionalRule):
    """The conditional rule as if D held all but the last 3 tokens of a 100-token prompt
    (the mocks' router reads no prompt)."""

    def decide(
        self, prompt_tokens: int, hit_tokens: int | None, queued: int, streams: int = 0
    ) -> PathChoice:
        return super().decide(100, 97, queued, streams)


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


class HeldStreams(LocalEngines):
    """`LocalEngines` whose streamed answers stay open (after a first chunk) until
    `release` is set; `opened` is set once one has sent its first chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.opened, self.release = asyncio.Event(), asyncio.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if not body.get("stream"):
            return super().__call__(request)
        self.calls.append((str(request.url.host), body))
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=self._held(), headers=headers)

    async def _held(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"text": "a"}]}\n\n'
        self.opened.set()
        await self.release.wait()
        yield b"data: [DONE]\n\n"


async def _streams_on_d1_then_a_sibling(max_tokens: int) -> tuple[Router, int]:
    """One streamed request asking for `max_tokens` held open on D1, then a sibling
    (max_tokens 5): the router, and D1's streams while the first one was open."""
    engines = HeldStreams()
    router = _router(HeldPrefix(), [D1])  # the default max running: 0
    d1 = router.decode.backends[0]
    async with _client(router, engines) as client:
        first = asyncio.create_task(
            client.post("/v1/completions", json={**BODY, "stream": True, "max_tokens": max_tokens})
        )
        await asyncio.wait_for(engines.opened.wait(), 5)
        streams = d1.streams
        assert (await client.post("/v1/completions", json=BODY)).status_code == 200
        engines.release.set()
        assert (await first).text.endswith("data: [DONE]\n\n")
    assert (d1.streams, d1.in_flight) == (0, 0)  # counted out when the stream ended
    return router, streams


async def test_a_decode_engine_decoding_a_stream_of_this_router_gets_siblings_through_p() -> None:
    router, streams = await _streams_on_d1_then_a_sibling(max_tokens=5)
    assert streams == 1  # a local prefill there would hold that stream up one step
    assert [(d.role, d.path) for d in router.routing.recent] == [
        ("decode", "local"), ("decode", "pd"), ("prefill", "pd")
    ]
    assert router.routing.recent[1].why == "1 streams decoding there > max running 0"


async def test_a_one_token_request_in_flight_is_no_stream() -> None:
    # Asking for one token, it ends at its first: a local prefill stalls no stream of it.
    router, streams = await _streams_on_d1_then_a_sibling(max_tokens=1)
    assert streams == 0
    assert [(d.role, d.path) for d in router.routing.recent] == [
        ("decode", "local"), ("decode", "local")
    ]


async def test_a_wave_of_streamed_siblings_sends_its_first_local_and_the_rest_through_p() -> None:
    # `bench ab --interleave` sends a c4 group in waves of four requests that start
    # together: the first finds no stream on D and goes local; from its decode call on it
    # is a stream there, so the other three go through P (docs/routing.md, "Measured").
    engines = HeldStreams()
    router = _router(HeldPrefix(), [D1])
    d1 = router.decode.backends[0]
    body = {**BODY, "stream": True, "max_tokens": 5}
    async with _client(router, engines) as client:
        wave = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(4)]
        for _ in range(500):  # until every stream is open on D
            if sum(1 for _, b in engines.calls if b.get("stream")) == 4:
                break
            await asyncio.sleep(0.01)
        streams = d1.streams
        engines.release.set()
        answers = await asyncio.gather(*wave)
    assert all(a.text.endswith("data: [DONE]\n\n") for a in answers)
    assert streams == 4 and (d1.streams, d1.in_flight) == (0, 0)
    decode = [d for d in router.routing.recent if d.role == "decode"]
    assert [d.path for d in decode] == ["local", "pd", "pd", "pd"]
    # the second sees the local one's stream; the later ones also those of the earlier
    # ones P computed (the mock P answers at once)
    assert decode[1].why == "1 streams decoding there > max running 0"
    assert all(d.why.endswith(" streams decoding there > max running 0") for d in decode[2:])
    local = [b for _, b in engines.calls if b.get("stream") and b["kv_transfer_params"] is None]
    assert len(local) == 1  # D prefilled one of the four itself


async def test_max_running_lets_a_decode_engine_take_siblings_next_to_streams() -> None:
    engines = LocalEngines()
    router = _router(HeldPrefix(max_running=1), [D1])
    d1 = router.decode.backends[0]
    async with _client(router, engines) as client:
        d1.streams = 1  # one stream there: allowed by max running 1
        assert (await client.post("/v1/completions", json=BODY)).status_code == 200
        d1.streams = 2  # two: P computes, D only loads
        assert (await client.post("/v1/completions", json=BODY)).status_code == 200
    assert [u for u, _ in engines.calls] == [D1, P1, D1]
    assert engines.calls[0][1]["kv_transfer_params"] is None
    assert _paths(router) == [("decode", D1, "local"), ("decode", D1, "pd"), ("prefill", P1, "pd")]
    assert router.routing.recent[1].why == "2 streams decoding there > max running 1"


async def test_a_streamed_local_request_is_relayed() -> None:
    engines = LocalEngines()
    router = _router(ConditionalRule("never"), [D1])
    async with _client(router, engines) as client:
        resp = await client.post("/v1/completions", json={**BODY, "stream": True})
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    assert [u for u, _ in engines.calls] == [D1]


async def test_a_stream_dropped_unread_gives_its_counts_back() -> None:
    """A client that leaves before the first byte: Starlette never reads the relay, whose
    `finally` then never runs. Collected, it still counts the stream out of the engine (a
    leaked stream would keep local requests off D for good) and unqueues its local prefill
    (which would fill D's queue cap)."""
    import gc

    engines = HeldStreams()
    router = _router(HeldPrefix(), [D1])
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(engines))
    d1 = router.decode.backends[0]
    decision = router.routing.pick(router.decode, set(), None)
    assert decision is not None
    decision.local_prefill = 3
    router.in_flight = 1  # the request's own count, as `Router.handle` holds it
    body = ClientBody.parse(json.dumps({**BODY, "stream": True}).encode())
    response = await router._local(decision, "/v1/completions", body, {})
    assert (d1.in_flight, d1.streams, router.routing.in_flight.queued_prefill(D1)) == (1, 1, 3)
    del response
    gc.collect()
    assert (d1.in_flight, d1.streams, router.routing.in_flight.queued_prefill(D1)) == (0, 0, 0)
    assert router.in_flight == 0
    await asyncio.sleep(0)  # the engine's stream is closed on the loop
