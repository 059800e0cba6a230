"""Engine metrics: counters, latency histograms, speculative decoding (docs/metrics.md).

The engine thread writes; a metrics endpoint reads a consistent-enough snapshot at scrape time
(integers and fixed bucket arrays only, so a torn read is off by one event at worst). Cache
counters live in `KVCacheManager.stats` (docs/design.md §9) and are exported next to these.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

# Prometheus buckets in seconds (vLLM's TTFT buckets, trimmed).
LATENCY_BUCKETS: tuple[float, ...] = (
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
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)
    num_steps: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    kv_transfer: Histogram = field(default_factory=Histogram)  # remote KV loads (P/D, decode)

    def finished(self, reason: str) -> None:
        self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1

    def speculation(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens:
            self.spec_num_drafts += 1
            self.spec_num_draft_tokens += num_draft_tokens
            self.spec_num_accepted_tokens += num_accepted
