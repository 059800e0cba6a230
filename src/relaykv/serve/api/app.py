"""The FastAPI application: routes, the access gate, error handlers, the engine's lifespan.

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`,
`GET /v1/models/{id}` (404 `model_not_found` for another id), `GET /health`, `GET /metrics`,
`GET /steps` (the engine's recent steps, `engine/step_log.py`; `?since=T` keeps those that
ended at or after T on the engine's `time.perf_counter()`, which `now` gives), and for
production routers vLLM's `POST /tokenize`,
`/detokenize`, `/v1/completions/render`, `/v1/chat/completions/render` (`vllm_compat`) and
`GET /get_load`, `/health_generate` (`router_probes`). The gate (a plain ASGI middleware, so
streams and disconnects pass through untouched) answers every `/v1/...` request (and
`/tokenize`, `/detokenize`) with 401 when an API key is set and the request's
`Authorization: Bearer` does not match (`/steps` too: it lists the requests served), and
with 503 while the server drains; `/health` and
`/health_generate` turn 503 when draining, `/metrics` and `/get_load` always answer.

P/D (docs/pd.md): nothing P/D-specific lives here; `kv_transfer_params` already flows from the
request to the engine and back. A router or launcher builds the engine with
`build_engine(options, connector=...)` and serves it with `create_app`.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from relaykv.common.messages.api_errors import APIError, install_error_handlers
from relaykv.engine import AsyncEngine
from relaykv.serve.api import chat, completions, router_probes, vllm_compat
from relaykv.serve.api.inputs import check_model
from relaykv.serve.api.metrics import engine_registry
from relaykv.serve.api.state import ServerState, server_state
from relaykv.serve.assembly.engine_factory import ServedEngine
from relaykv.serve.sglang.bootstrap import refuse_sglang_bootstrap, sglang_bootstrap

log = logging.getLogger("relaykv.serve")


# Outside /v1, the tokenizer routes are gated too (router_probes.py: why not the probes).
def _gated(path: str) -> bool:
    return path.startswith("/v1") or path in vllm_compat.GATED_PATHS or path == "/steps"


class AccessGate:
    """API key and draining checks in front of `/v1/...` (see module docstring)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _gated(scope["path"]):
            error = self._refusal(scope)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> APIError | None:
        key = self.state.api_key
        if key:
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            # bytes on both sides: compare_digest refuses non-ASCII str (a 500, not a 401)
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                token.strip(), key.encode("utf-8")
            ):
                message = "Missing API key" if not given else "Incorrect API key provided"
                return APIError(
                    401,
                    f"{message} (send Authorization: Bearer <key>)",
                    code="invalid_api_key",
                )
        if self.state.draining:
            return APIError(503, "the server is shutting down", code="service_unavailable")
        return None


def create_app(
    served: ServedEngine,
    *,
    api_key: str | None = None,
    drain_timeout: float = 30.0,
    idle_wait: float = 0.05,
) -> FastAPI:
    """An app serving `served`; its engine thread starts and stops with the app's lifespan."""
    state = ServerState(served, AsyncEngine(served.engine, idle_wait), api_key, drain_timeout)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.engine.start()
        try:
            yield
        finally:
            await state.stop_engine()

    app = FastAPI(
        title="relaykv", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.relaykv = state
    install_error_handlers(app)
    # SGLang's bootstrap P/D fields: refused, or the room handshake (serve/sglang/bootstrap.py)
    sglang_guard = [Depends(sglang_bootstrap)]
    app.include_router(completions.router, dependencies=sglang_guard)
    app.include_router(chat.router, dependencies=sglang_guard)
    # vLLM's extra endpoints production routers poll (vllm_compat.py, router_probes.py)
    app.include_router(vllm_compat.router, dependencies=[Depends(refuse_sglang_bootstrap)])
    app.include_router(router_probes.router)
    registry = engine_registry(served.engine, served.served_model_name)

    @app.get("/health")
    async def health(request: Request) -> Response:
        s = server_state(request)
        try:
            s.check_accepting()
        except APIError as exc:
            return exc.response()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/steps")
    async def steps(since: float = float("-inf")) -> Response:
        records = served.engine.steps.since(since)
        return JSONResponse(
            {"now": time.perf_counter(), "steps": [r.as_json() for r in records]}
        )

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        s = server_state(request)
        return JSONResponse({"object": "list", "data": [model_card(s)]})

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Response:
        s = server_state(request)
        check_model(model_id, s.model_name)
        return JSONResponse(model_card(s))

    app.add_middleware(AccessGate, state=state)
    return app


def model_card(state: ServerState) -> dict[str, Any]:
    served = state.served
    return {
        "id": served.served_model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "relaykv",
        "root": served.model.source,
        "parent": None,
        "max_model_len": served.max_model_len,
        "vocab_size": served.vocab_size,
        "tokenizer": served.model.tokenizer_dir,
    }


def app_state(app: FastAPI) -> ServerState:
    state: ServerState = app.state.relaykv
    return state
