"""`POST /v1/chat/completions`.

Messages become a prompt through the model's chat template (`relaykv.serve.chat_template`:
the tokenizer's own template rendered with jinja2, or the documented plain fallback). The
output length is `max_completion_tokens`, else `max_tokens`, else up to the context limit.
Streaming: the first chunk's delta carries `role: "assistant"` together with the first
text (no role-only chunk, so a benchmark's first token chunk is the first token), the
finish reason rides on the last text chunk, then the optional usage chunk and `[DONE]`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from relaykv.api_errors import APIError, bad_request
from relaykv.engine import RequestOutput
from relaykv.serve.chat_template import ChatTemplateError
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
from relaykv.serve.inputs import check_model, parse_body, sampling_params
from relaykv.serve.logprobs import chat_logprobs
from relaykv.serve.protocol import ChatCompletionRequest
from relaykv.serve.state import ServerState, server_state

router = APIRouter()


def _prompt(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    if not body.messages:
        raise bad_request("messages must not be empty", "messages")
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        return state.served.chat.encode(
            messages, body.add_generation_prompt, body.chat_template_kwargs
        )
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "messages") from None


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), ChatCompletionRequest)
    check_model(body.model, state.model_name)
    prompt_ids = _prompt(state, body)
    top_n = body.top_logprobs or 0
    if not 0 <= top_n <= 20:
        raise APIError(400, f"top_logprobs must be in [0, 20], got {top_n}", "top_logprobs")
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    params = sampling_params(
        body,
        max_tokens,
        max(1, top_n) if body.logprobs else 0,
        len(prompt_ids),
        state.served.max_model_len,
    )
    request_id = new_request_id("chatcmpl")
    stream = start_generation(
        state, request_id, prompt_ids, params, body.cache_salt, body.kv_transfer_params
    )
    head = {"id": request_id, "created": int(time.time()), "model": state.model_name}
    if body.stream:
        return StreamingResponse(_stream(state, stream, body, head), media_type="text/event-stream")
    try:
        result = await unless_disconnected(request, collect(state, stream))
    except ClientGone:
        return Response(status_code=499)
    last = result.last
    assert last is not None
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": result.text},
        "logprobs": chat_logprobs(state.served.tokenizer, result.logprobs, top_n)
        if body.logprobs
        else None,
        "finish_reason": last.finish_reason,
        "stop_reason": last.stop_reason,
    }
    if body.return_token_ids:
        choice["token_ids"] = result.token_ids
        choice["prompt_token_ids"] = prompt_ids
    answer = {**head, "object": "chat.completion", "choices": [choice], "usage": result.usage()}
    if body.kv_transfer_params is not None or last.kv_transfer_params is not None:
        answer["kv_transfer_params"] = last.kv_transfer_params
    return JSONResponse(answer)


async def _stream(
    state: ServerState,
    stream: AsyncIterator[RequestOutput],
    body: ChatCompletionRequest,
    head: dict[str, Any],
) -> AsyncIterator[bytes]:
    head = {**head, "object": "chat.completion.chunk"}
    top_n = body.top_logprobs or 0
    first = True
    last: RequestOutput | None = None
    try:
        async for out in outputs(state, stream):
            last = out
            delta: dict[str, Any] = {"content": out.new_text}
            if first:
                delta = {"role": "assistant", **delta}
                first = False
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": chat_logprobs(state.served.tokenizer, out.new_logprobs or [], top_n)
                if body.logprobs
                else None,
                "finish_reason": out.finish_reason if out.finished else None,
            }
            if out.finished:
                choice["stop_reason"] = out.stop_reason
            if body.return_token_ids:
                choice["token_ids"] = out.new_token_ids
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if body.include_usage:
                chunk["usage"] = None
            yield sse(chunk)
        if body.include_usage and last is not None:
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
