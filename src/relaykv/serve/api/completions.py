"""`POST /v1/completions` (OpenAI legacy completions, vLLM's extras).

One prompt per request (a string, token ids, or a one-element list of either), `n` = 1, no
echo. Running, streaming, usage and `kv_transfer_params` are the shared generation handler's
(`relaykv.serve.api.generation`); this module parses the body and spells a completions choice.
`usage.prompt_tokens_details.cached_tokens` is the prompt tokens this engine reused from its
prefix cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response

from relaykv.common.messages.api_errors import APIError
from relaykv.engine import RequestOutput
from relaykv.serve.api.engine_stream import Collected
from relaykv.serve.api.generation import GenerationJob, run_generation
from relaykv.serve.api.inputs import check_model, completion_prompt, parse_body, sampling_params
from relaykv.serve.api.logprobs import CompletionLogprobs, engine_logprobs
from relaykv.serve.api.protocol import CompletionRequest
from relaykv.serve.api.state import server_state

if TYPE_CHECKING:  # relaykv.model loads torch
    from relaykv.model.text.chat_template import TextTokenizer

router = APIRouter()


class CompletionShape:
    """`text_completion` choices; logprob `text_offset`s run across a stream's chunks."""

    request_id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, body: CompletionRequest, tokenizer: TextTokenizer | None) -> None:
        self.body = body
        self.logprobs = (
            CompletionLogprobs(tokenizer, body.logprobs) if body.logprobs is not None else None
        )

    def _choice(
        self, text: str, token_ids: list[int], out: RequestOutput, finished: bool, lp: Any
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": lp,
            "finish_reason": out.finish_reason if finished else None,
            "stop_reason": out.stop_reason if finished else None,
        }
        if self.body.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def opening_choices(self) -> list[dict[str, Any]]:
        return []

    def stream_choice(self, out: RequestOutput) -> dict[str, Any]:
        lp = self.logprobs.build(out.new_logprobs or []) if self.logprobs is not None else None
        return self._choice(out.new_text, out.new_token_ids, out, out.finished, lp)

    def final_choice(self, result: Collected, prompt_ids: list[int]) -> dict[str, Any]:
        assert result.last is not None
        lp = self.logprobs.build(result.logprobs) if self.logprobs is not None else None
        choice = self._choice(result.text, result.token_ids, result.last, True, lp)
        if self.body.return_token_ids:
            choice["prompt_token_ids"] = prompt_ids
        return choice


def completion_logprobs(body: CompletionRequest) -> int:
    """Logprobs per token the engine must return for a completions body (generation and
    render alike); a `logprobs` outside [0, 20] is a 400."""
    if body.logprobs is not None and not 0 <= body.logprobs <= 20:
        raise APIError(400, f"logprobs must be in [0, 20], got {body.logprobs}", "logprobs")
    return engine_logprobs(body.logprobs)


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), CompletionRequest)
    check_model(body.model, state.model_name)
    served = state.served
    prompt_ids = completion_prompt(body.prompt, served.tokenizer)
    params = sampling_params(
        body, body.max_tokens, completion_logprobs(body), len(prompt_ids), served.max_model_len
    )
    shape = CompletionShape(body, served.tokenizer)
    return await run_generation(request, state, GenerationJob(body, prompt_ids, params, shape))
