"""Request bodies of the OpenAI API (and vLLM's extras), validated strictly.

Strict pydantic models: a number where a string belongs, `"16"` for `max_tokens` or `true`
for an integer is a 400, not a silent coercion. Unknown fields are accepted and ignored
(clients send `user`, `metadata`, ...), as vLLM does. Fields that would change the output but
are not implemented (penalties, logit_bias, n > 1, echo, best_of > 1, suffix, tools) are
refused with a 400 naming them by `unsupported_fields`, never silently ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    include_usage: bool = False


class SamplingFields(BaseModel):
    """What completions and chat share."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    return_token_ids: bool = False  # vLLM extension: token ids in each choice
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported_fields(self) -> list[tuple[str, str]]:
        """(field, reason) for every requested feature this server does not implement."""
        found = []
        if self.n != 1:
            found.append(("n", f"only n=1 is supported, got {self.n}"))
        if self.best_of not in (None, 1):
            found.append(("best_of", f"only best_of=1 is supported, got {self.best_of}"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0.0):
                found.append((name, f"{name} is not supported"))
        if self.repetition_penalty not in (None, 1.0):
            found.append(("repetition_penalty", "repetition_penalty is not supported"))
        if self.logit_bias:
            found.append(("logit_bias", "logit_bias is not supported"))
        return found


class CompletionRequest(SamplingFields):
    prompt: Any = None  # str | list[int] | [str] | [list[int]]: checked in `serve/api/inputs.py`
    max_tokens: int | None = 16  # OpenAI's default; null: up to the context limit
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def unsupported_fields(self) -> list[tuple[str, str]]:
        found = super().unsupported_fields()
        if self.echo:
            found.append(("echo", "echo is not supported"))
        if self.suffix:
            found.append(("suffix", "suffix is not supported"))
        return found


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported_fields(self) -> list[tuple[str, str]]:
        found = super().unsupported_fields()
        if self.tools:
            found.append(("tools", "tool calling is not supported"))
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            found.append(("response_format", "only response_format type 'text' is supported"))
        if self.top_logprobs is not None and not self.logprobs:
            found.append(("top_logprobs", "top_logprobs needs logprobs: true"))
        return found
