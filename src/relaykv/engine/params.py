"""Request-level sampling parameters, validated before a request reaches the scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from relaykv.steps import SamplingParams as StepSampling


class InvalidRequest(ValueError):
    """A request the engine refuses; `field` names the offending parameter (HTTP 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What the OpenAI API calls sampling fields, plus vLLM's extras.

    `top_k` 0 or -1 disables top-k; `temperature` 0 is greedy; `stop` strings end the output
    (excluded from the text); `stop_token_ids` and EOS end it too (unless `ignore_eos`), but
    never before `min_tokens`.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 0

    def validate(self, vocab_size: int | None = None) -> None:
        if self.max_tokens < 1:
            raise InvalidRequest(
                "max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}"
            )
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise InvalidRequest(
                "min_tokens", f"min_tokens must be in [0, max_tokens], got {self.min_tokens}"
            )
        if not self.temperature >= 0:
            raise InvalidRequest("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise InvalidRequest("top_k", f"top_k must be -1, 0 or positive, got {self.top_k}")
        if not 0 <= self.logprobs <= 20:
            raise InvalidRequest("logprobs", f"logprobs must be in [0, 20], got {self.logprobs}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop", "stop strings must be non-empty strings")
        for token in self.stop_token_ids:
            if not isinstance(token, int) or token < 0 or (vocab_size and token >= vocab_size):
                raise InvalidRequest("stop_token_ids", f"invalid stop token id {token!r}")

    def for_step(self) -> StepSampling:
        """The part the model runner needs for one step."""
        return StepSampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(0, self.top_k),
            seed=self.seed,
            logprobs=self.logprobs,
        )
