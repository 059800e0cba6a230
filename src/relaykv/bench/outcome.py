"""What one streamed request produced: the record metrics are computed from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestOutcome:
    """Timings in seconds from `time.perf_counter`; `start_time` is when it was sent.

    `ttft` is send -> first token chunk, `itl` the gaps between later token chunks,
    `latency` (E2EL) send -> last token chunk. `output_tokens` is `usage.completion_tokens`
    (or the number of token chunks when the server sent no usage, `usage_missing`).
    `cached_tokens` is `usage.prompt_tokens_details.cached_tokens`, None when absent.
    `client_queue_time` is how long it waited for `--max-concurrency` before it was sent
    (vLLM's `queue_times`).
    """

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    generated_text: str = ""
    error: str = ""
    usage_missing: bool = False
    client_queue_time: float = 0.0
