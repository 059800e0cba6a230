"""The router's HTTP endpoints (docs/pd.md "The router", docs/routing.md, docs/metrics.md).

`POST /v1/completions` and `/v1/chat/completions` go down the request path (`relay.py`);
`GET /v1/models` is answered by a healthy decode engine; `/health`, `/routing`, `/cluster` and
`/metrics` describe the router (`/routing`, with its per-request records, behind the API key
when one is set; docs/security.md, "Listeners"). The app's lifespan owns the HTTP client to
the engines and the health loop (`Router.health_loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from relaykv.common.messages.api_errors import install_error_handlers
from relaykv.router.engine_calls import relayed, unavailable
from relaykv.router.metrics import CountResponses, router_registry
from relaykv.router.relay import Router, forward_headers


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
        router.authorize(request)
        assert router.client is not None
        backend = router.decode.first_healthy()
        if backend is None:
            return unavailable("decode")
        url = f"{backend.url}{request.url.path}"
        try:
            return relayed(await router.client.get(url, headers=forward_headers(request)))
        except httpx.HTTPError as exc:
            router.decode.failed(backend, str(exc))
            return unavailable("decode")

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
    async def routing(request: Request, recent: int = 0) -> dict[str, Any]:
        router.authorize(request)  # per-request records: behind the API key when one is set
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
