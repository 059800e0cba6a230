"""`POST /v1/chat/completions`.

Messages become a prompt through the model's chat template (`relaykv.model.text.chat_template`:
the tokenizer's own template rendered with jinja2, or the documented plain fallback). The
output length is `max_completion_tokens`, else `max_tokens`, else up to the context limit.
Running and streaming are the shared generation handler's (`relaykv.serve.api.generation`): a
chat stream opens with vLLM's role-only chunk, then one `delta.content` chunk per engine step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response

from relaykv.common.messages.api_errors import APIError, bad_request
from relaykv.engine import RequestOutput
from relaykv.serve.api.engine_stream import Collected
from relaykv.serve.api.generation import GenerationJob, run_generation
from relaykv.serve.api.inputs import check_model, parse_body, sampling_params
from relaykv.serve.api.logprobs import chat_logprobs
from relaykv.serve.api.protocol import ChatCompletionRequest
from relaykv.serve.api.state import ServerState, server_state

if TYPE_CHECKING:  # relaykv.model loads torch
    from relaykv.model.text.chat_template import TextTokenizer

router = APIRouter()


def chat_prompt(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    """The messages rendered through the model's chat template, as token ids."""
    from relaykv.model.text.chat_template import ChatTemplateError

    if not body.messages:
        raise bad_request("messages must not be empty", "messages")
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        return state.served.chat.encode(
            messages, body.add_generation_prompt, body.chat_template_kwargs
        )
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "messages") from None


class ChatShape:
    """`chat.completion` choices (`message`) and chunks (`delta`), vLLM's opening chunk."""

    request_id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, body: ChatCompletionRequest, tokenizer: TextTokenizer | None) -> None:
        self.body = body
        self.tokenizer = tokenizer
        self.top_n = body.top_logprobs or 0

    def _logprobs(self, entries: Any) -> dict[str, Any] | None:
        if not self.body.logprobs:
            return None
        return chat_logprobs(self.tokenizer, entries or [], self.top_n)

    def opening_choices(self) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]

    def stream_choice(self, out: RequestOutput) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": out.new_text},
            "logprobs": self._logprobs(out.new_logprobs),
            "finish_reason": out.finish_reason if out.finished else None,
        }
        if out.finished:
            choice["stop_reason"] = out.stop_reason
        if self.body.return_token_ids:
            choice["token_ids"] = out.new_token_ids
        return choice

    def final_choice(self, result: Collected, prompt_ids: list[int]) -> dict[str, Any]:
        last = result.last
        assert last is not None
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": self._logprobs(result.logprobs),
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
        }
        if self.body.return_token_ids:
            choice["token_ids"] = result.token_ids
            choice["prompt_token_ids"] = prompt_ids
        return choice


def chat_inputs(
    state: ServerState, body: ChatCompletionRequest
) -> tuple[list[int], int | None, int]:
    """What every chat endpoint (generation and render) derives from a body: the prompt ids,
    the output cap (`max_completion_tokens`, else `max_tokens`) and how many logprobs per
    token the engine must return. A `top_logprobs` outside [0, 20] is a 400."""
    prompt_ids = chat_prompt(state, body)
    top_n = body.top_logprobs or 0
    if not 0 <= top_n <= 20:
        raise APIError(400, f"top_logprobs must be in [0, 20], got {top_n}", "top_logprobs")
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    return prompt_ids, max_tokens, max(1, top_n) if body.logprobs else 0


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), ChatCompletionRequest)
    check_model(body.model, state.model_name)
    prompt_ids, max_tokens, logprobs = chat_inputs(state, body)
    params = sampling_params(
        body,
        max_tokens,
        logprobs,
        len(prompt_ids),
        state.served.max_model_len,
    )
    shape = ChatShape(body, state.served.tokenizer)
    return await run_generation(request, state, GenerationJob(body, prompt_ids, params, shape))
