"""The P/D router: an OpenAI-compatible front for prefill and decode engines.

A completion (or chat completion) goes to a prefill engine first (unless the decode engine
chosen for it prefills it itself: conditional disaggregation, `Routing.decide_path`,
docs/routing.md), with `kv_transfer_params: {"do_remote_decode": true}` (P validates the
client's max_tokens as D will, then generates one token); P computes the prompt, keeps the
blocks the P/D plan names and answers where they are, in a grant signed for the decode engine
the router chose first (`destination_engine_id`, `relaykv.router.destinations`). The request
then goes to that decode engine with P's `kv_transfer_params`; D pulls what it does not hold
and streams the completion back through the router.

The path reads top to bottom in `Router.handle`: the body (`intake.py`: limits, the client's
own bytes), its prompt tokens (`prompt.py`), the decode engine's `Choice` (`routing.py`, the
one `pick`; `decision.py`), carried down through P's prefill and D's decode
(`engine_calls.py`: an engine that cannot be reached or answers 5xx leaves the rotation and
the request is retried on another one; when none is left the client gets a 503 with an
OpenAI error body; an engine's 4xx goes back to the client unchanged). Bodies travel as the
client's own bytes with the fields a hop sets appended (`ClientBody.with_fields`), so the
engines judge exactly what the client sent. The HTTP endpoints are `app.py`; every response
is counted (`metrics.py`). Limits, timeouts, disconnects and the drain: `intake.py`,
`common/plumbing/disconnect.py`, `server.py` (docs/pd.md "Limits and timeouts").
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from relaykv.common.messages.api_errors import LOCAL_ADMISSION_REFUSED, APIError
from relaykv.common.plumbing.disconnect import ClientGone, unless_disconnected
from relaykv.router.backends import Backend, BackendPool
from relaykv.router.decision import Choice
from relaykv.router.destinations import destination_id, refused_grant
from relaykv.router.engine_calls import EngineCalls, relayed, unavailable
from relaykv.router.intake import ClientBody, IntakeLimits, read_body
from relaykv.router.metrics import RouterStats
from relaykv.router.prompt import Prompt
from relaykv.router.routing import Routing

HEALTH_INTERVAL_S = 2.0
FORWARD_HEADERS = ("authorization",)


class Router:
    def __init__(
        self,
        prefill: list[str],
        decode: list[str],
        *,
        api_key: str | None = None,
        request_timeout: float = 600.0,
        connect_timeout: float = 5.0,
        prefill_timeout: float = 120.0,
        limits: IntakeLimits | None = None,
        public_url: str = "",
        routing: Routing | None = None,
    ) -> None:
        self.prefill = BackendPool("prefill", prefill)
        self.decode = BackendPool("decode", decode)
        self.api_key = api_key
        self.timeout = httpx.Timeout(request_timeout, connect=connect_timeout)
        # A prefill is one forward pass: a P that takes longer is hung or drowning, and the
        # request moves on to another P (docs/pd.md, "Failures").
        self.prefill_timeout = httpx.Timeout(prefill_timeout, connect=connect_timeout)
        self.limits = limits or IntakeLimits()
        self.draining = False  # set on SIGTERM (server.py): new requests get 503
        self.in_flight = 0  # requests being answered, streams included
        self.public_url = public_url
        self.stats = RouterStats()
        self.routing = routing or Routing("least-loaded")
        self.calls = EngineCalls(self.timeout, self.stats, on_stream_end=self._stream_ended)

    @property
    def client(self) -> httpx.AsyncClient | None:
        return self.calls.client

    @client.setter
    def client(self, client: httpx.AsyncClient | None) -> None:
        self.calls.client = client

    # -- one request -------------------------------------------------------------------
    async def handle(self, request: Request, path: str) -> Response:
        self.stats.requests += 1
        self.authorize(request)
        if self.draining:
            raise APIError(503, "the router is shutting down", code="draining")
        self.in_flight += 1
        streaming = False
        try:
            body = ClientBody.parse(await read_body(request, self.limits))
            headers = forward_headers(request)
            headers["content-type"] = "application/json"
            try:
                reading = self.routing.prompts.read(self.client, self.prefill, body.data, headers)
                prompt = await unless_disconnected(request, reading)
                response = await unless_disconnected(
                    request, self._prefill_and_decode(path, body, headers, prompt)
                )
            except ClientGone:
                return Response(status_code=499)  # nginx's "client closed request"
            streaming = isinstance(response, StreamingResponse)
            return response
        finally:
            if not streaming:  # a stream counts itself out when it ends (_stream_ended)
                self.in_flight -= 1

    def _stream_ended(self) -> None:
        self.in_flight -= 1

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}":
            raise APIError(401, "missing or invalid API key", code="invalid_api_key")

    async def _prefill_and_decode(
        self, path: str, body: ClientBody, headers: dict[str, str], prompt: Prompt | None
    ) -> Response:
        """Choose D; then either D prefills the prompt itself (a local request, conditional
        disaggregation: `Routing.decide_path`) or P computes it with a grant for D and D
        decodes (`relaykv.router.destinations`). A D that fails is not called again: the
        next D needs a grant of its own, so P computes again (mostly a hit on its held
        blocks). A local request whose D failed before answering is retried through P
        (unless `--disaggregation never`: on another D), as is one D refused because its
        pool cannot take it now (429, `LOCAL_ADMISSION_REFUSED`; D may then load it): nothing
        reached the client, so it gets one answer."""
        assert self.client is not None
        tried: set[Backend] = set()
        refreshed = False
        force_pd = ""
        while (decode := self.routing.pick(self.decode, tried, prompt)) is not None:
            backend = decode.backend
            tried.add(backend)
            if self.routing.decide_path(decode, force_pd).local:
                response = await self._local(decode, path, body, headers)
                if response is None:  # D failed: another D, through P unless `never`
                    self.stats.retries += 1
                    if self.routing.conditional.mode != "never":
                        force_pd = f"retried through P: the local attempt on {backend.url} failed"
                    continue
                if refused_locally(response):  # D's pool is full now: P computes, D loads
                    self.stats.retries += 1
                    force_pd = f"retried through P: {backend.url} refused it locally (its pool)"
                    tried.discard(backend)
                    continue
                return response
            with decode:  # the prompt is in flight on D until D answers (router/pending.py)
                try:
                    destination = await destination_id(self.client, backend, headers)
                except httpx.HTTPError as exc:  # D is down: found before P computes anything
                    self.decode.failed(backend, f"{exc.__class__.__name__}: {exc}")
                    self.stats.retries += 1
                    continue
                backend.in_flight += 1  # counted from the choice, so concurrent choices spread
                try:
                    transfer, error = await self._prefill(path, body, headers, prompt, destination)
                finally:
                    backend.in_flight -= 1
                if error is not None:
                    return error
                decode_body = body.with_fields({"kv_transfer_params": transfer})
                await decode.prefix_loaded()
                response = await self.calls.decode(
                    self.decode, backend, path, decode_body, headers, body.stream, body.decodes
                )
                if isinstance(response, StreamingResponse):
                    response.body_iterator = decode.until_first(response.body_iterator)
            if response is None:
                self.stats.retries += 1
                continue
            if destination is not None and not refreshed and refused_grant(response):
                # D may have restarted between two health checks (a new engine id): ask it
                # again and retry once with a grant for the engine that is there now.
                refreshed, backend.engine_id = True, None
                with contextlib.suppress(httpx.HTTPError):
                    if await destination_id(self.client, backend, headers) != destination:
                        tried.discard(backend)
                        continue
            return response
        return unavailable("decode")

    async def _local(
        self, decode: Choice, path: str, body: ClientBody, headers: dict[str, str]
    ) -> Response | None:
        """A local request: the decode engine computes the prompt itself (the client's body,
        without transfer parameters). None: the engine failed before answering."""
        with decode:  # in flight there (its suffix queued) until D's first bytes
            await decode.prefix_loaded()  # a load of the same prefix there lands first
            local_body = body.with_fields({"kv_transfer_params": None})
            response = await self.calls.decode(
                self.decode, decode.backend, path, local_body, headers, body.stream, body.decodes
            )
            if isinstance(response, StreamingResponse):
                response.body_iterator = decode.until_first(response.body_iterator)
        return response

    async def _prefill(
        self,
        path: str,
        body: ClientBody,
        headers: dict[str, str],
        prompt: Prompt | None,
        destination: str | None,
    ) -> tuple[dict[str, Any] | None, Response | None]:
        """P computes the prompt; returns its transfer parameters (a grant bound to the
        decode engine `destination`) or a response to relay.

        P gets the client's own max_tokens and min_tokens: it validates the request exactly
        as D will (and answers 400 before any compute for what D would refuse), then
        generates one token whatever max_tokens says (docs/pd.md)."""
        grant: dict[str, Any] = {"do_remote_decode": True}
        if destination is not None:
            grant["destination_engine_id"] = destination
        overrides = {"stream": False, "stream_options": None, "kv_transfer_params": grant}
        prefill_body = body.with_fields(overrides)
        tried: set[Backend] = set()
        while (prefill := self.routing.pick(self.prefill, tried, prompt)) is not None:
            backend = prefill.backend
            tried.add(backend)
            with prefill:
                resp = await self.calls.post(
                    self.prefill, backend, path, prefill_body, headers, self.prefill_timeout
                )
            if resp is None:
                self.stats.retries += 1
                continue
            if resp.status_code != 200:
                return None, relayed(resp)
            try:
                params = prefill.note_answer(resp.json()).get("kv_transfer_params")
            except (ValueError, AttributeError):
                params = None
            if not isinstance(params, dict) or not params.get("do_remote_prefill"):
                self.prefill.failed(backend, "answered without kv_transfer_params")
                continue
            return params, None
        return None, unavailable("prefill")

    # -- background -----------------------------------------------------------------------
    async def health_loop(self) -> None:
        assert self.client is not None
        while True:
            await asyncio.gather(self.prefill.check(self.client), self.decode.check(self.client))
            await self.routing.refresh(self.client, [self.prefill, self.decode])
            await asyncio.sleep(HEALTH_INTERVAL_S)

    def cluster(self) -> dict[str, Any]:
        return {"router": self.public_url, "prefill": self.prefill.urls, "decode": self.decode.urls}


def refused_locally(response: Response) -> bool:
    """A decode engine's answer refusing a local request for now (its pool, 429)."""
    return response.status_code == 429 and LOCAL_ADMISSION_REFUSED.encode() in bytes(
        response.body
    )


def forward_headers(request: Request) -> dict[str, str]:
    """The client's headers an engine needs (its API key)."""
    return {k: v for k, v in request.headers.items() if k.lower() in FORWARD_HEADERS}
