"""One engine request under an HTTP handler: start, stream, collect.

The handler itself (one for chat and completions) is `relaykv.serve.api.generation`.

`start_generation` validates with the engine before anything is sent (so every refusal is a
400 with a proper body, not an error inside a stream) and returns the output stream.
`collect` gathers a non-streaming result; the handler runs it under the floor's disconnect
guard (`relaykv.common.plumbing.disconnect`): a client that goes away cancels the
collection, and cancelling the engine stream aborts the request and frees its blocks
(`AsyncEngine.generate`'s contract). Streaming responses get the same from Starlette, which
cancels the body iterator on `http.disconnect`. The SSE bytes: `relaykv.common.messages.sse`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from relaykv.common.messages.api_errors import LOCAL_ADMISSION_REFUSED, APIError
from relaykv.common.messages.steps import TokenLogprobs
from relaykv.engine import EngineDeadError, InvalidRequest, RequestOutput, SamplingParams
from relaykv.serve.api.state import ServerState


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(num_prompt: int, num_output: int, num_cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
        "prompt_tokens_details": {"cached_tokens": num_cached},
    }


def engine_failure(exc: EngineDeadError, state: ServerState) -> APIError:
    if state.engine.dead is None:
        return APIError(503, str(exc), code="service_unavailable")
    return APIError(500, str(exc), code="engine_dead")


@dataclass(slots=True)
class Collected:
    """A finished request, folded from its outputs."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    last: RequestOutput | None = None

    def add(self, out: RequestOutput) -> None:
        self.token_ids.extend(out.new_token_ids)
        self.text += out.new_text
        if out.new_logprobs:
            self.logprobs.extend(out.new_logprobs)
        self.last = out

    def usage(self) -> dict[str, Any]:
        out = self.last
        assert out is not None
        return usage(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)


def start_generation(
    state: ServerState,
    request_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    cache_salt: str | None,
    kv_transfer_params: dict[str, Any] | None,
) -> AsyncIterator[RequestOutput]:
    """Check everything the engine would refuse (400; 429 for a local request a decode
    engine's pool cannot take now) and return the output stream."""
    state.check_accepting()
    engine = state.engine.engine
    try:
        engine.validate(prompt_ids, params, kv_transfer_params, cache_salt)
    except InvalidRequest as exc:
        raise APIError(400, str(exc), exc.field) from None
    refused = engine.refuses_locally(prompt_ids, params, kv_transfer_params)
    if refused is not None:
        raise APIError(429, refused, code=LOCAL_ADMISSION_REFUSED)
    return state.engine.generate(
        request_id,
        prompt_ids,
        params,
        cache_salt=cache_salt,
        kv_transfer_params=kv_transfer_params,
    )


async def outputs(
    state: ServerState, stream: AsyncIterator[RequestOutput]
) -> AsyncIterator[RequestOutput]:
    """The engine's outputs with its exceptions turned into `APIError`; a request the engine
    ended with an error raises a 500 after its last output."""
    try:
        async for out in stream:
            if out.finished and out.finish_reason == "error":
                raise APIError(500, out.error or "the request failed in the engine")
            yield out
    except InvalidRequest as exc:
        raise APIError(400, str(exc), exc.field) from None
    except EngineDeadError as exc:
        raise engine_failure(exc, state) from None
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # aborts an unfinished request


async def collect(state: ServerState, stream: AsyncIterator[RequestOutput]) -> Collected:
    result = Collected()
    async for out in outputs(state, stream):
        result.add(out)
    return result
