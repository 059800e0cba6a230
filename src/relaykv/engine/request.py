"""A request's life in the engine: states, tokens, progress, timing and its outputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from relaykv.common.messages.steps import SamplingParams, TokenLogprobs
from relaykv.kvcache import CacheRequest


class RequestState(Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"  # a decode engine pulling KV from P
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    # P/D: `{"do_remote_decode": True}` on a prefill engine; on a decode engine what the
    # prefill engine answered (`do_remote_prefill`, where its blocks are).
    kv_transfer_params: dict[str, Any] | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    draft_token_ids: list[int] = field(default_factory=list)
    cache: CacheRequest | None = None
    load_start_time: float | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens reused from this engine's cache
    num_external_tokens: int = 0  # prompt tokens received from another engine
    num_preemptions: int = 0
    admitted: bool = False
    first_token_time: float | None = None
    first_scheduled_time: float | None = None  # queue time ends here (vLLM's metrics)
    last_token_time: float | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    text: str = ""
    emitted_chars: int = 0  # characters of `text` already streamed
    # incremental detokenization offsets (see `relaykv.engine.detokenizer`)
    prefix_offset: int = 0
    read_offset: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_at(self, position: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[position] if position < n else self.output_ids[position - n]

    def tokens(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def is_prefill_only(self) -> bool:
        """A prefill engine's half of a P/D request (its KV is sent, not decoded here)."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_decode"))

    @property
    def is_remote_prefill(self) -> bool:
        """A decode engine's half of a P/D request (its prompt KV comes from P)."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_prefill"))


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request (streamed to its caller)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str = ""
    new_logprobs: list[TokenLogprobs] | None = None
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    error: str | None = None
