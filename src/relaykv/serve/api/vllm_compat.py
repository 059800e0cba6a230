"""vLLM's tokenizer and render endpoints, which production routers call before routing.

vllm-router's `cache_aware` and `kv_aware` policies turn a request into the token ids the
engine will see before choosing engines (docs/pd.md "Behind vllm-router"): they try
`POST /v1/completions/render` (or `/v1/chat/completions/render`), then `POST /tokenize`. A 404
makes them route blind. The shapes are vLLM's:

* `POST /tokenize` `{"prompt": str}` or `{"messages": [...]}` ->
  `{"count": N, "max_model_len": M, "tokens": [ids], "token_strs": [str] | null}`.
* `POST /detokenize` `{"tokens": [ids]}` -> `{"prompt": str}`.
* `POST /v1/completions/render` (a completions body) -> a list of one `GenerateRequest`
  `{"request_id", "token_ids", "features", "sampling_params", "model", "stream",
  "stream_options", "cache_salt", "priority", "kv_transfer_params"}`.
* `POST /v1/chat/completions/render` (a chat body) -> one `GenerateRequest`.

The ids are exactly those `/v1/completions` and `/v1/chat/completions` would give the engine
(the same tokenizer, `relaykv.serve.api.chat.chat_prompt` and checks), so a router's prefix tree
and relaykv's KV events describe the same tokens. Render validates like generation (400 for what
generation would refuse) and generates nothing. `add_special_tokens` is accepted at vLLM's
defaults (true for a prompt, false for messages), which is what generation does; the other
value is refused with a 400 naming it rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from relaykv.common.messages.api_errors import APIError, bad_request
from relaykv.engine import InvalidRequest
from relaykv.serve.api.chat import chat_inputs, chat_prompt
from relaykv.serve.api.completions import completion_logprobs
from relaykv.serve.api.engine_stream import new_request_id
from relaykv.serve.api.inputs import (
    check_model,
    completion_prompt,
    json_object,
    parse_body,
    sampling_params,
)
from relaykv.serve.api.protocol import ChatCompletionRequest, CompletionRequest
from relaykv.serve.api.state import ServerState, server_state

router = APIRouter()

# Paths outside /v1 that compute on the engine's tokenizer or model: the API-key gate covers
# them like /v1/... (`relaykv.serve.api.app.AccessGate`).
GATED_PATHS = frozenset({"/tokenize", "/detokenize"})


def _flag(data: dict[str, Any], name: str, default: bool) -> bool:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean", name)
    return value


def _token_strs(state: ServerState, ids: list[int]) -> list[str]:
    tokenizer = state.served.tokenizer
    assert tokenizer is not None
    return [tokenizer.decode([i]) for i in ids]


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    state = server_state(request)
    data = json_object(await request.body())
    if state.served.tokenizer is None:
        raise bad_request("this model has no tokenizer")
    chat = "messages" in data
    if _flag(data, "add_special_tokens", not chat) is chat:
        value = "true" if chat else "false"
        raise bad_request(
            f"add_special_tokens={value} is not supported: the ids are always those "
            f"{'chat' if chat else 'completions'} generation uses",
            "add_special_tokens",
        )
    return_strs = _flag(data, "return_token_strs", False)
    if _flag(data, "continue_final_message", False):
        raise bad_request("continue_final_message is not supported", "continue_final_message")
    if chat:
        chat_body = parse_body(await request.body(), ChatCompletionRequest)
        check_model(chat_body.model, state.model_name)
        ids = chat_prompt(state, chat_body)
    else:
        check_model(data.get("model"), state.model_name)
        prompt = data.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request("prompt must be a string (or send messages)", "prompt")
        ids = list(state.served.tokenizer.encode(prompt))
    return JSONResponse(
        {
            "count": len(ids),
            "max_model_len": state.served.max_model_len,
            "tokens": ids,
            "token_strs": _token_strs(state, ids) if return_strs else None,
        }
    )


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    state = server_state(request)
    data = json_object(await request.body())
    check_model(data.get("model"), state.model_name)
    tokenizer = state.served.tokenizer
    if tokenizer is None:
        raise bad_request("this model has no tokenizer")
    tokens = data.get("tokens")
    if not isinstance(tokens, list):
        raise bad_request("tokens must be a list of token ids", "tokens")
    vocab = state.served.vocab_size
    for t in tokens:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise bad_request(f"invalid token id {t!r} (vocabulary size {vocab})", "tokens")
    return JSONResponse({"prompt": tokenizer.decode(tokens)})


def _generate_request(
    state: ServerState,
    prefix: str,
    prompt_ids: list[int],
    body: CompletionRequest | ChatCompletionRequest,
    max_tokens: int | None,
    logprobs: int,
) -> dict[str, Any]:
    """vLLM's `GenerateRequest` for a request generation would accept (400 otherwise)."""
    params = sampling_params(
        body, max_tokens, logprobs, len(prompt_ids), state.served.max_model_len
    )
    try:
        state.engine.engine.validate(prompt_ids, params, body.kv_transfer_params, body.cache_salt)
    except InvalidRequest as exc:
        raise APIError(400, str(exc), exc.field) from None
    sampling = asdict(params)
    sampling["stop"] = list(params.stop)
    sampling["stop_token_ids"] = list(params.stop_token_ids)
    return {
        "request_id": new_request_id(prefix),
        "token_ids": prompt_ids,
        "features": None,
        "sampling_params": sampling,
        "model": state.model_name,
        "stream": body.stream,
        "stream_options": body.stream_options.model_dump() if body.stream_options else None,
        "cache_salt": body.cache_salt,
        "priority": 0,
        "kv_transfer_params": body.kv_transfer_params,
    }


@router.post("/v1/completions/render")
async def render_completion(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), CompletionRequest)
    check_model(body.model, state.model_name)
    prompt_ids = completion_prompt(body.prompt, state.served.tokenizer)
    logprobs = completion_logprobs(body)
    rendered = _generate_request(state, "cmpl", prompt_ids, body, body.max_tokens, logprobs)
    return JSONResponse([rendered])


@router.post("/v1/chat/completions/render")
async def render_chat_completion(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), ChatCompletionRequest)
    check_model(body.model, state.model_name)
    prompt_ids, max_tokens, logprobs = chat_inputs(state, body)
    rendered = _generate_request(state, "chatcmpl", prompt_ids, body, max_tokens, logprobs)
    return JSONResponse(rendered)
