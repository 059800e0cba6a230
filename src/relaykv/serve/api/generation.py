"""The one generation handler behind `/v1/completions` and `/v1/chat/completions`.

Both APIs run the same steps, here and only here: validate with the engine before anything
is sent (a refusal is a 400, never an error inside a stream), stream or collect, watch for
disconnects (a client that goes away aborts its request), put `kv_transfer_params` in the
answer (P/D: on the last streamed chunk, or in the body), add usage, and end a stream with
`[DONE]`, with an engine failure after the stream started sent in-band. What differs between
the two APIs, the spelling of a choice, is a `ResponseShape`.

Streams follow vLLM's wire format (docs/serving.md "Streaming"): one chunk per engine step
that produced tokens (a speculative step may carry several tokens; a step whose bytes do not
complete a UTF-8 character carries empty text), the finish reason on the last one, then the
usage chunk with empty `choices` when `stream_options.include_usage` is set, then `[DONE]`.
A chat stream opens, as vLLM's does, with a role-only chunk (`{"role": "assistant",
"content": ""}`) sent when the first step's output arrives, so every token step has a chunk
of its own and a client that skips the opening chunk loses no inter-token gap.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from relaykv.common.messages.sse import DONE, sse_error, sse_event
from relaykv.common.plumbing.disconnect import ClientGone, unless_disconnected
from relaykv.engine import RequestOutput, SamplingParams
from relaykv.serve.api.engine_stream import (
    Collected,
    collect,
    new_request_id,
    outputs,
    start_generation,
    usage,
)
from relaykv.serve.api.protocol import SamplingFields
from relaykv.serve.api.state import ServerState


class ResponseShape(Protocol):
    """How one API spells its answer. Implementations are per request (they may keep state
    across chunks, e.g. the completions `text_offset`).

    * `request_id_prefix`, `object_name` (non-streamed `object`), `chunk_object` (streamed);
    * `opening_choices()`: choices of the chunks sent before the first token chunk (chat's
      role-only chunk), each its own chunk;
    * `stream_choice(out)`: the choice of the chunk for one engine step;
    * `final_choice(result, prompt_ids)`: the choice of a non-streamed answer.
    """

    request_id_prefix: str
    object_name: str
    chunk_object: str

    def opening_choices(self) -> list[dict[str, Any]]: ...

    def stream_choice(self, out: RequestOutput) -> dict[str, Any]: ...

    def final_choice(self, result: Collected, prompt_ids: list[int]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class GenerationJob:
    """One validated request: what to run and how to answer it."""

    body: SamplingFields
    prompt_ids: list[int]
    params: SamplingParams
    shape: ResponseShape


async def run_generation(request: Request, state: ServerState, job: GenerationJob) -> Response:
    """Start the request in the engine (400 on refusal) and answer it, streamed or not."""
    body, shape = job.body, job.shape
    request_id = new_request_id(shape.request_id_prefix)
    stream = start_generation(
        state, request_id, job.prompt_ids, job.params, body.cache_salt, body.kv_transfer_params
    )
    head = {"id": request_id, "created": int(time.time()), "model": state.model_name}
    if body.stream:
        events = _events(state, stream, body, shape, {**head, "object": shape.chunk_object})
        return StreamingResponse(events, media_type="text/event-stream")
    try:
        result = await unless_disconnected(request, collect(state, stream))
    except ClientGone:
        return Response(status_code=499)
    last = result.last
    assert last is not None
    answer = {
        "id": request_id,
        "object": shape.object_name,
        "created": head["created"],
        "model": head["model"],
        "choices": [shape.final_choice(result, job.prompt_ids)],
        "usage": result.usage(),
    }
    if body.kv_transfer_params is not None or last.kv_transfer_params is not None:
        answer["kv_transfer_params"] = last.kv_transfer_params
    return JSONResponse(answer)


async def _events(
    state: ServerState,
    stream: AsyncIterator[RequestOutput],
    body: SamplingFields,
    shape: ResponseShape,
    head: dict[str, Any],
) -> AsyncIterator[bytes]:
    include_usage = body.include_usage

    def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
        event: dict[str, Any] = {**head, "choices": choices}
        if include_usage:
            event["usage"] = None
        return event

    last: RequestOutput | None = None
    try:
        async for out in outputs(state, stream):
            if last is None:
                for choice in shape.opening_choices():
                    yield sse_event(chunk([choice]))
            last = out
            event = chunk([shape.stream_choice(out)])
            if out.finished and out.kv_transfer_params is not None:
                event["kv_transfer_params"] = out.kv_transfer_params
            yield sse_event(event)
        if include_usage and last is not None:
            tokens = usage(last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens)
            yield sse_event({**head, "choices": [], "usage": tokens})
    except Exception as exc:  # an engine failure mid-stream: tell the client in-band
        yield sse_error(exc)
    yield DONE
