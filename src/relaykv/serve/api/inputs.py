"""From a request body to what the engine takes: prompt ids and `SamplingParams`.

Everything here raises `APIError` (400/404) and changes nothing; range checks that need the
engine (token ids against the vocabulary, the context limit, the pool) are the engine's own
`validate`, whose `InvalidRequest` the handlers turn into a 400 naming the field.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from relaykv.common.messages.api_errors import APIError, bad_request, validation_error
from relaykv.engine import InvalidRequest, SamplingParams
from relaykv.serve.api.protocol import SamplingFields

if TYPE_CHECKING:  # relaykv.model loads torch
    from relaykv.model.text.chat_template import TextTokenizer

Body = TypeVar("Body", bound=BaseModel)


def check_values(value: Any, path: str = "") -> None:
    """400 naming the field for a value JSON cannot carry faithfully: a non-finite number
    (`NaN`, `Infinity`, `1e309`, which Python's parser accepts) or a string that is not
    Unicode text (a lone surrogate such as `"\\ud800"`), anywhere in the body."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise bad_request(f"{path or 'body'}: numbers must be finite, got {value}", _top(path))
    elif isinstance(value, str):
        _check_text(value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{path}.{key}" if path else "a key")
            check_values(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_values(item, f"{path}.{i}" if path else str(i))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        where = path.encode("utf-8", "backslashreplace").decode()
        raise bad_request(
            f"{where}: strings must be valid Unicode (no lone surrogates)", _top(where)
        ) from None


def _top(path: str) -> str | None:
    return path.split(".", 1)[0] or None


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object whose numbers are finite and whose strings are text."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    check_values(data)
    return data


def parse_body(raw: bytes, model: type[Body]) -> Body:
    data = json_object(raw)
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if isinstance(body, SamplingFields):
        for field, reason in body.unsupported_fields():
            raise bad_request(reason, field)
    return body


def check_model(requested: str | None, served_name: str) -> None:
    """OpenAI answers an unknown model with 404 `model_not_found`; so do we."""
    if requested is not None and requested != served_name:
        raise APIError(
            404,
            f"The model `{requested}` does not exist; this server serves `{served_name}`",
            "model",
            "model_not_found",
        )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def completion_prompt(prompt: Any, tokenizer: TextTokenizer | None) -> list[int]:
    """A string, a list of token ids, or a one-element list of either -> token ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if tokenizer is None:
            raise bad_request("this model has no tokenizer: send the prompt as token ids", "prompt")
        if not prompt:
            raise bad_request("the prompt is empty", "prompt")
        return list(tokenizer.encode(prompt))
    if isinstance(prompt, list):
        if not prompt:
            raise bad_request("the prompt is empty", "prompt")
        if any(isinstance(p, str | list) for p in prompt):
            raise bad_request("only one prompt per request is supported", "prompt")
        if not all(_is_token(t) for t in prompt):
            bad = next(t for t in prompt if not _is_token(t))
            raise bad_request(f"invalid token id {bad!r} in the prompt", "prompt")
        return list(prompt)
    if prompt is None:
        raise bad_request("prompt is required", "prompt")
    raise bad_request(
        "prompt must be a string, a list of token ids, or a one-element list of either", "prompt"
    )


def sampling_params(
    body: SamplingFields,
    max_tokens: int | None,
    logprobs: int,
    num_prompt_tokens: int,
    max_model_len: int,
) -> SamplingParams:
    """`max_tokens` None means up to the context limit (the engine checks the rest)."""
    if max_tokens is None:
        max_tokens = max(1, max_model_len - num_prompt_tokens)
    stop: tuple[str, ...] = ()
    if isinstance(body.stop, str):
        stop = (body.stop,)
    elif body.stop:
        stop = tuple(body.stop)
    # Fields the client left out take SamplingParams' own defaults (vLLM's), set in one place.
    given = {
        name: getattr(body, name)
        for name in ("temperature", "top_p", "top_k", "seed")
        if getattr(body, name) is not None
    }
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            stop=stop,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
            logprobs=logprobs,
            **given,
        )
    except InvalidRequest as exc:
        raise bad_request(str(exc), exc.field) from None
