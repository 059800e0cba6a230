"""The P/D router: an OpenAI-compatible front for prefill and decode engines.

A completion (or chat completion) goes to a prefill engine first, with `kv_transfer_params:
{"do_remote_decode": true}` (P validates the client's max_tokens as D will, then generates one
token); P computes the prompt, keeps the blocks the P/D plan names and answers where they are,
in a grant signed for the decode engine the router chose first (`destination_engine_id`,
`relaykv.router.destinations`). The request then goes to that decode engine with P's
`kv_transfer_params`; D pulls what it does not hold and streams the completion back through the
router. Engines are chosen by `relaykv.router.routing` (`--routing`: cache-aware by default,
docs/routing.md); an engine that cannot be reached or answers 5xx leaves the rotation and the
request is retried on another one; when none is left the client gets a 503 with an OpenAI error
body. Errors an engine returns for the request itself (4xx) go back to the client unchanged.
Bodies travel as the client's own bytes with the fields a hop sets appended
(`relaykv.router.body`), so the engines judge exactly what the client sent; every response is
counted (`relaykv.router.metrics`). Limits, timeouts, disconnects and the drain:
`relaykv.router.intake`, `.disconnect`, `.server` (docs/pd.md "Limits and timeouts").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from relaykv.common.messages.api_errors import APIError, error_body, install_error_handlers
from relaykv.router.backends import Backend, BackendPool
from relaykv.router.body import ClientBody
from relaykv.router.destinations import destination_id, refused_grant
from relaykv.router.disconnect import ClientGone, unless_disconnected
from relaykv.router.intake import IntakeLimits, read_body
from relaykv.router.metrics import CountResponses, RouterStats, router_registry
from relaykv.router.routing import Prompt, Routing

log = logging.getLogger(__name__)

HEALTH_INTERVAL_S = 2.0
_FORWARD_HEADERS = ("authorization",)


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
        self.client: httpx.AsyncClient | None = None

    # -- one request -------------------------------------------------------------------
    async def handle(self, request: Request, path: str) -> Response:
        self.stats.requests += 1
        self._authorize(request)
        if self.draining:
            raise APIError(503, "the router is shutting down", code="draining")
        self.in_flight += 1
        streaming = False
        try:
            body = ClientBody.parse(await read_body(request, self.limits))
            headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
            headers["content-type"] = "application/json"
            prompt = self.routing.prompt(body.data)
            try:
                if prompt is None and self.client is not None and "messages" in body.data:
                    prompt = await unless_disconnected(request, self.routing.chat_prompt(
                        self.client, self.prefill, body.data, headers))
                response = await unless_disconnected(
                    request, self._prefill_and_decode(path, body, headers, prompt)
                )
            except ClientGone:
                return Response(status_code=499)  # nginx's "client closed request"
            streaming = isinstance(response, StreamingResponse)
            return response
        finally:
            if not streaming:  # a stream counts itself out when it ends (_relay_stream)
                self.in_flight -= 1

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}":
            raise APIError(401, "missing or invalid API key", code="invalid_api_key")

    async def _prefill_and_decode(
        self, path: str, body: ClientBody, headers: dict[str, str], prompt: Prompt | None
    ) -> Response:
        """Choose D, have P compute the prompt with a grant for D, then decode on D
        (`relaykv.router.destinations`). A D that fails is not called again: the next D
        needs a grant of its own, so P computes again (mostly a hit on its held blocks)."""
        assert self.client is not None
        tried: set[Backend] = set()
        refreshed = False
        while (backend := self.routing.pick(self.decode, tried, prompt)) is not None:
            tried.add(backend)
            with self.routing.in_flight_on(backend, prompt) as loading:  # router/pending.py
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
                await self.routing.await_prefix_load(backend, prompt, loading)
                response = await self._decode_on(backend, path, decode_body, headers, body.stream)
                if isinstance(response, StreamingResponse):
                    response.body_iterator = loading.until_first(response.body_iterator)
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
        return _unavailable("decode")

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
        while (backend := self.routing.pick(self.prefill, tried, prompt)) is not None:
            tried.add(backend)
            with self.routing.in_flight_on(backend, prompt) as computing:
                resp = await self._post(
                    self.prefill, backend, path, prefill_body, headers, self.prefill_timeout
                )
            if resp is None:
                self.stats.retries += 1
                continue
            if resp.status_code != 200:
                return None, _relay(resp)
            try:
                params = computing.note_answer(resp.json()).get("kv_transfer_params")
            except (ValueError, AttributeError):
                params = None
            if not isinstance(params, dict) or not params.get("do_remote_prefill"):
                self.prefill.failed(backend, "answered without kv_transfer_params")
                continue
            return params, None
        return None, _unavailable("prefill")

    async def _post(
        self, pool: BackendPool, backend: Backend, path: str, body: bytes, headers: dict,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response | None:
        assert self.client is not None
        backend.in_flight += 1
        backend.requests += 1
        try:
            resp = await self.client.post(
                f"{backend.url}{path}", content=body, headers=headers,
                timeout=timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            pool.failed(backend, f"{exc.__class__.__name__}: {exc}")
            return None
        finally:
            backend.in_flight -= 1
        if resp.status_code >= 500 and resp.status_code != 503:
            pool.failed(backend, f"answered {resp.status_code}")
            return None
        if resp.status_code == 503:  # draining: not broken, just not taking work
            backend.healthy = False
            backend.last_error = "draining (503)"
            return None
        return resp

    async def _decode_on(
        self, backend: Backend, path: str, body: bytes, headers: dict[str, str], stream: bool
    ) -> Response | None:
        """D's answer (streamed through), or None when D failed (out of rotation)."""
        if not stream:
            resp = await self._post(self.decode, backend, path, body, headers)
            return None if resp is None else _relay(resp)
        opened = await self._open_stream(backend, path, body, headers)
        if opened is None:
            return None
        if opened.status_code != 200:
            await opened.aread()
            await opened.aclose()
            return _relay(opened)
        return StreamingResponse(
            self._relay_stream(backend, opened), media_type="text/event-stream"
        )

    async def _open_stream(
        self, backend: Backend, path: str, body: bytes, headers: dict
    ) -> httpx.Response | None:
        assert self.client is not None
        req = self.client.build_request(
            "POST", f"{backend.url}{path}", content=body, headers=headers
        )
        backend.in_flight += 1
        backend.requests += 1
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as exc:
            backend.in_flight -= 1
            self.decode.failed(backend, f"{exc.__class__.__name__}: {exc}")
            return None
        if resp.status_code >= 500:
            backend.in_flight -= 1
            await resp.aclose()
            if resp.status_code == 503:
                backend.healthy = False
            else:
                self.decode.failed(backend, f"answered {resp.status_code}")
            return None
        if resp.status_code != 200:
            backend.in_flight -= 1
        return resp

    async def _relay_stream(self, backend: Backend, resp: httpx.Response) -> AsyncIterator[bytes]:
        """Pass D's SSE bytes through; a client that goes away closes D's stream too. Every
        stream ends with `data: [DONE]`, a broken one after an in-band error event."""
        tail = b""
        try:
            try:
                async for chunk in resp.aiter_raw():
                    tail = (tail + chunk)[-64:]
                    yield chunk
            except httpx.HTTPError as exc:
                self.decode.failed(backend, f"stream broke: {exc.__class__.__name__}")
                self.stats.stream_errors += 1
                yield stream_error(f"the decode engine's stream broke: {exc}")
                tail = b""
            if b"data: [DONE]" not in tail:
                if tail:  # D closed cleanly without finishing the stream
                    self.stats.stream_errors += 1
                    yield stream_error("the decode engine ended the stream early")
                yield DONE_EVENT
        finally:
            backend.in_flight -= 1
            self.in_flight -= 1
            await resp.aclose()

    # -- background -----------------------------------------------------------------------
    async def health_loop(self) -> None:
        assert self.client is not None
        while True:
            await asyncio.gather(self.prefill.check(self.client), self.decode.check(self.client))
            await self.routing.refresh(self.client, [self.prefill, self.decode])
            await asyncio.sleep(HEALTH_INTERVAL_S)

    def cluster(self) -> dict[str, Any]:
        return {"router": self.public_url, "prefill": self.prefill.urls, "decode": self.decode.urls}


DONE_EVENT = b"data: [DONE]\n\n"


def stream_error(message: str) -> bytes:
    """An in-band SSE error event (what OpenAI streams send for a failure mid-stream)."""
    return f"data: {json.dumps(error_body(502, message))}\n\n".encode()


def _relay(resp: httpx.Response) -> Response:
    """An engine's answer, passed through (content type and status kept)."""
    return Response(
        content=resp.content,
        status_code=resp.status_code,
        media_type=resp.headers.get("content-type", "application/json"),
    )


def _unavailable(role: str) -> Response:
    message = f"no {role} engine is available (all failed or are out of rotation)"
    return JSONResponse(error_body(503, message, code="no_backend"), status_code=503)


def create_router_app(router: Router) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        router.client = httpx.AsyncClient(timeout=router.timeout, limits=limits)
        task = asyncio.create_task(router.health_loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await router.routing.stop()
            await router.client.aclose()

    app = FastAPI(title="relaykv router", lifespan=lifespan)
    install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await router.handle(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await router.handle(request, "/v1/chat/completions")

    async def relay_get(request: Request) -> Response:
        router._authorize(request)
        assert router.client is not None
        backend = router.decode.pick()
        if backend is None:
            return _unavailable("decode")
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        url = f"{backend.url}{request.url.path}"
        try:
            return _relay(await router.client.get(url, headers=headers))
        except httpx.HTTPError as exc:
            router.decode.failed(backend, str(exc))
            return _unavailable("decode")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await relay_get(request)

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Response:
        return await relay_get(request)

    @app.get("/health")
    async def health() -> Response:
        ok = router.prefill.num_healthy > 0 and router.decode.num_healthy > 0
        body = {
            "status": "ok" if ok else "degraded",
            "prefill": [b.describe() for b in router.prefill.backends],
            "decode": [b.describe() for b in router.decode.backends],
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/routing")
    async def routing(recent: int = 0) -> dict[str, Any]:
        return router.routing.describe(recent=bool(recent))

    @app.get("/cluster")
    async def cluster() -> dict[str, Any]:
        return router.cluster()

    registry = router_registry(router.stats, [*router.prefill.backends, *router.decode.backends])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(CountResponses, stats=router.stats)
    return app
