"""What production routers poll besides generation: `/get_load` and `/health_generate`.

* `GET /get_load` -> `{"load": N}`, N the requests this engine holds (queued, prefilling,
  decoding or waiting for KV). vllm-router's `power_of_two` policy compares it between
  engines. Like `/health` and `/metrics` it needs no API key and computes nothing.
* `GET /health_generate` -> `{"status": "ok"}` once the engine has generated one token for a
  one-token prompt (SGLang's and vllm-router's deep health check: the HTTP server answering
  is not enough, the model must step). 503 while draining or if that generation fails or
  takes longer than `HEALTH_GENERATE_TIMEOUT_S`, 500 if the engine died. Polls arriving
  while one check runs share it, and a success is reused for `HEALTH_GENERATE_REUSE_S`, so a
  router polling every engine often costs at most one tiny forward a second. The prompt is
  shorter than a block, so it never enters the prefix cache or the KV events. It needs no
  API key, like `/health`: vllm-router's health checker sends none (with a key required,
  every engine would look dead to it), and the reuse window bounds what anyone can make it
  cost.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from relaykv.common.messages.api_errors import APIError
from relaykv.engine import SamplingParams
from relaykv.serve.api.engine_stream import collect, new_request_id, start_generation
from relaykv.serve.api.state import ServerState, server_state

router = APIRouter()

HEALTH_GENERATE_TIMEOUT_S = 30.0
HEALTH_GENERATE_REUSE_S = 1.0


@dataclass(slots=True)
class HealthCheck:
    """The last deep health check of one server (kept on `app.state`)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_ok: float = float("-inf")


def _health_check(request: Request) -> HealthCheck:
    check = getattr(request.app.state, "relaykv_health_check", None)
    if check is None:
        check = HealthCheck()
        request.app.state.relaykv_health_check = check
    return check


async def _generate_one_token(state: ServerState) -> None:
    model = state.served.model
    token = model.bos_token_id if model.bos_token_id is not None else 0
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    stream = start_generation(state, new_request_id("health"), [token], params, None, None)
    result = await asyncio.wait_for(collect(state, stream), HEALTH_GENERATE_TIMEOUT_S)
    if len(result.token_ids) != 1:
        raise APIError(503, "the health generation produced no token", code="unhealthy")


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    state = server_state(request)
    check = _health_check(request)
    try:
        state.check_accepting()
        async with check.lock:
            if time.monotonic() - check.last_ok > HEALTH_GENERATE_REUSE_S:
                await _generate_one_token(state)
                check.last_ok = time.monotonic()
    except APIError as exc:
        return exc.response()
    except TimeoutError:
        return APIError(
            503,
            f"the engine did not generate a token within {HEALTH_GENERATE_TIMEOUT_S:g} s",
            code="unhealthy",
        ).response()
    return JSONResponse({"status": "ok"})


@router.get("/get_load")
async def get_load(request: Request) -> Response:
    return JSONResponse({"load": server_state(request).engine.num_active})
