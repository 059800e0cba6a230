"""`POST /v1/completions` (OpenAI legacy completions, vLLM's extras).

One prompt per request (a string, token ids, or a one-element list of either), `n` = 1, no
echo. Streaming sends one chunk per engine step that produced tokens (the finish reason
rides on the last one), then with `stream_options.include_usage` a usage chunk with empty
`choices`, then `data: [DONE]`. `usage.prompt_tokens_details.cached_tokens` is the prompt
tokens this engine reused from its prefix cache. `kv_transfer_params` goes to the engine
and comes back in the body (P/D).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from relaykv.api_errors import APIError
from relaykv.engine import RequestOutput
from relaykv.serve.generation import (
    DONE,
    ClientGone,
    collect,
    new_request_id,
    outputs,
    sse,
    sse_error,
    start_generation,
    unless_disconnected,
    usage,
)
from relaykv.serve.inputs import check_model, completion_prompt, parse_body, sampling_params
from relaykv.serve.logprobs import CompletionLogprobs, engine_logprobs
from relaykv.serve.protocol import CompletionRequest
from relaykv.serve.state import ServerState, server_state

router = APIRouter()


def _choice(
    out: RequestOutput | None,
    text: str,
    token_ids: list[int],
    logprobs: dict | None,
    body: CompletionRequest,
    finished: bool,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": out.finish_reason if (out is not None and finished) else None,
        "stop_reason": out.stop_reason if (out is not None and finished) else None,
    }
    if body.return_token_ids:
        choice["token_ids"] = token_ids
    return choice


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), CompletionRequest)
    check_model(body.model, state.model_name)
    served = state.served
    prompt_ids = completion_prompt(body.prompt, served.tokenizer)
    if body.logprobs is not None and not 0 <= body.logprobs <= 20:
        raise APIError(400, f"logprobs must be in [0, 20], got {body.logprobs}", "logprobs")
    params = sampling_params(
        body,
        body.max_tokens,
        engine_logprobs(body.logprobs),
        len(prompt_ids),
        served.max_model_len,
    )
    request_id = new_request_id("cmpl")
    stream = start_generation(
        state, request_id, prompt_ids, params, body.cache_salt, body.kv_transfer_params
    )
    created = int(time.time())
    head = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": state.model_name,
    }
    if body.stream:
        return StreamingResponse(_stream(state, stream, body, head), media_type="text/event-stream")
    try:
        result = await unless_disconnected(request, collect(state, stream))
    except ClientGone:
        return Response(status_code=499)
    last = result.last
    assert last is not None
    lp = None
    if body.logprobs is not None:
        lp = CompletionLogprobs(served.tokenizer, body.logprobs).build(result.logprobs)
    choice = _choice(last, result.text, result.token_ids, lp, body, True)
    if body.return_token_ids:
        choice["prompt_token_ids"] = prompt_ids
    answer = {**head, "choices": [choice], "usage": result.usage()}
    if body.kv_transfer_params is not None or last.kv_transfer_params is not None:
        answer["kv_transfer_params"] = last.kv_transfer_params
    return JSONResponse(answer)


async def _stream(
    state: ServerState,
    stream: AsyncIterator[RequestOutput],
    body: CompletionRequest,
    head: dict[str, Any],
) -> AsyncIterator[bytes]:
    logprobs = (
        CompletionLogprobs(state.served.tokenizer, body.logprobs)
        if body.logprobs is not None
        else None
    )
    include_usage = body.include_usage
    last: RequestOutput | None = None
    try:
        async for out in outputs(state, stream):
            last = out
            lp = logprobs.build(out.new_logprobs or []) if logprobs is not None else None
            chunk = {
                **head,
                "choices": [_choice(out, out.new_text, out.new_token_ids, lp, body, out.finished)],
            }
            if include_usage:
                chunk["usage"] = None
            if out.finished and out.kv_transfer_params is not None:
                chunk["kv_transfer_params"] = out.kv_transfer_params
            yield sse(chunk)
        if include_usage and last is not None:
            yield sse(
                {
                    **head,
                    "choices": [],
                    "usage": usage(
                        last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens
                    ),
                }
            )
    except Exception as exc:  # an engine failure mid-stream: tell the client in-band
        yield sse_error(exc)
    yield DONE
