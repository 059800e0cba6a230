"""Engine metrics: counters, latency histograms, speculative decoding (docs/metrics.md).

The engine thread writes; a metrics endpoint reads a consistent-enough snapshot at scrape time
(integers and fixed bucket arrays only, so a torn read is off by one event at worst). Cache
counters live in `KVCacheManager.stats` (docs/design.md §9) and are exported next to these.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

# vLLM's buckets (vllm/v1/metrics/loggers.py), so its dashboards' quantiles line up.
LATENCY_BUCKETS: tuple[float, ...] = (  # time_to_first_token_seconds
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS: tuple[float, ...] = (  # inter_token_latency, request_time_per_output_token
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (  # e2e, queue, prefill, decode, inference
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS: tuple[float, ...] = (
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
)


def token_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 buckets up to `max_value` (request_prompt_tokens and friends)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass(slots=True)
class Histogram:
    """Cumulative-ready bucket counts plus a window of recent samples for percentiles."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1
        self.recent.append(value)

    def percentile(self, q: float) -> float:
        if not self.recent:
            return 0.0
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@dataclass(slots=True)
class EngineMetrics:
    """Counters and vLLM's per-request and per-iteration histograms (docs/metrics.md).

    Per request, observed when it finishes: queue = arrival -> first scheduled, prefill =
    first scheduled -> first token, decode = first token -> finish, inference = first
    scheduled -> finish, TPOT = decode / (generated - 1); token counts: prompt, generated,
    prompt tokens computed here (neither cached nor received). Per step: tokens computed.
    """

    max_model_len: int = 4096
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)
    num_steps: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    # A decode engine's own prefill (conditional disaggregation, docs/routing.md): requests
    # that arrived without KV, and prompt tokens it scheduled for them and for failed loads.
    local_requests: int = 0
    local_prefill_tokens: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    prefill: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    decode: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    inference: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKEN_BUCKETS))
    kv_transfer: Histogram = field(default_factory=Histogram)  # remote KV loads (P/D, decode)
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)
    request_prefill_kv_computed_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        buckets = token_buckets(self.max_model_len)
        self.request_prompt_tokens = Histogram(buckets)
        self.request_generation_tokens = Histogram(buckets)
        self.request_prefill_kv_computed_tokens = Histogram(buckets)

    def request_done(
        self,
        now: float,
        arrival: float,
        scheduled: float | None,
        first_token: float | None,
        prompt: int,
        generated: int,
        computed_prompt: int,
    ) -> None:
        """A finished request's figures (times from `time.monotonic`)."""
        self.e2e.observe(now - arrival)
        self.request_prompt_tokens.observe(prompt)
        self.request_generation_tokens.observe(generated)
        self.request_prefill_kv_computed_tokens.observe(computed_prompt)
        if scheduled is None:  # aborted or refused before it ever ran
            return
        self.queue.observe(scheduled - arrival)
        self.inference.observe(now - scheduled)
        if first_token is not None:
            self.prefill.observe(first_token - scheduled)
            self.decode.observe(now - first_token)
            if generated > 1:
                self.tpot.observe((now - first_token) / (generated - 1))

    def finished(self, reason: str) -> None:
        self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1

    def speculation(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens:
            self.spec_num_drafts += 1
            self.spec_num_draft_tokens += num_draft_tokens
            self.spec_num_accepted_tokens += num_accepted
