"""Benchmark metrics as pure functions of request outcomes (docs/benchmarking.md "Metrics").

Definitions follow vLLM's `calculate_metrics` (vllm/benchmarks/serve.py):
* over successful requests: TTFT, ITL (all gaps pooled), E2EL, and TPOT =
  (E2EL - TTFT) / (output_len - 1) only for output_len > 1;
* mean / median / std (population, numpy's default) / percentiles (numpy's linear
  interpolation), reported in ms; an empty list reports 0 (vLLM's `np.mean(x or 0)`);
* request_throughput = completed / duration, output_throughput = sum(output) / duration,
  total_token_throughput = (sum(input) + sum(output)) / duration;
* goodput = requests meeting every listed SLO (value <= SLO; a request with output_len <= 1
  has TPOT 0 for this test) / duration;
* max_output_tokens_per_s: every token chunk is stamped (start + ttft, then + each ITL) and
  counted in one-second buckets from the first successful send; the fullest bucket wins;
* max_concurrent_requests: as vLLM computes it: one-second buckets from the first
  successful send, each successful request counted in every bucket from its start's to its
  end's (both included); the fullest bucket wins. A request that ends in the second another
  starts counts as concurrent with it, so this is at least the exact peak;
* peak_concurrent_requests: the exact peak of successful requests in flight, by a sweep over
  half-open intervals [start, start + E2EL) (an end before a start at equal times).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from relaykv.bench.outcome import RequestOutcome

METRIC_NAMES: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
METRIC_LABELS: dict[str, tuple[str, str]] = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


@dataclass(slots=True)
class MetricStats:
    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: list[tuple[float, float]]


@dataclass(slots=True)
class CacheReport:
    """SGLang's `--cache-report`: prompt and cached tokens over successful requests."""

    total_prompt_tokens: int
    total_cached_tokens: int
    cache_hit_rate_pct: float
    requests_reporting_cached: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "total_prompt_tokens": self.total_prompt_tokens,
            "total_cached_tokens": self.total_cached_tokens,
            "cache_hit_rate_pct": self.cache_hit_rate_pct,
            "requests_reporting_cached": self.requests_reporting_cached,
        }


@dataclass(slots=True)
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    peak_concurrent_requests: int
    stats: dict[str, MetricStats]
    cache: CacheReport
    output_lens: list[int] = field(default_factory=list)


def summarize(values_s: Sequence[float], percentiles: Sequence[float]) -> MetricStats:
    """Mean, median, std and percentiles of seconds, in milliseconds."""
    data = np.asarray(values_s if len(values_s) else [0.0], dtype=float)
    return MetricStats(
        mean_ms=float(np.mean(data)) * 1000,
        median_ms=float(np.median(data)) * 1000,
        std_ms=float(np.std(data)) * 1000,
        percentiles_ms=[(float(p), float(np.percentile(data, p)) * 1000) for p in percentiles],
    )


def request_tpot(outcome: RequestOutcome) -> float | None:
    """(E2EL - TTFT) / (output_len - 1), or None when output_len <= 1."""
    if outcome.output_tokens > 1:
        return (outcome.latency - outcome.ttft) / (outcome.output_tokens - 1)
    return None


def good_requests(successes: Sequence[RequestOutcome], slos_ms: dict[str, float]) -> int:
    """How many successful requests meet every SLO (ms) in `slos_ms`."""
    if not slos_ms:
        return 0
    good = 0
    for out in successes:
        values = {"ttft": out.ttft, "tpot": request_tpot(out) or 0.0, "e2el": out.latency}
        if all(values[name] <= slo / 1000 for name, slo in slos_ms.items()):
            good += 1
    return good


def peak_output_tokens_per_s(successes: Sequence[RequestOutcome]) -> float:
    """Tokens (streamed chunks) in the fullest one-second bucket."""
    if not successes:
        return 0.0
    origin = min(o.start_time for o in successes)
    end = max(o.start_time + o.latency for o in successes)
    buckets = np.zeros(math.ceil(end - origin) + 1)
    for out in successes:
        t = out.start_time + out.ttft
        stamps = [t]
        for gap in out.itl:
            t += gap
            stamps.append(t)
        for stamp in stamps:
            index = int(stamp - origin)
            if 0 <= index < len(buckets):
                buckets[index] += 1
    return float(buckets.max())


def peak_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """Peak overlap of half-open intervals [start, end)."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        events += [(start, 1), (end, -1)]
    events.sort()  # at equal times -1 sorts before +1: [a, b) and [b, c) do not overlap
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def cache_report(successes: Sequence[RequestOutcome]) -> CacheReport:
    prompt = sum(o.prompt_len for o in successes)
    cached = sum(o.cached_tokens or 0 for o in successes)
    return CacheReport(
        total_prompt_tokens=prompt,
        total_cached_tokens=cached,
        cache_hit_rate_pct=100.0 * cached / prompt if prompt else 0.0,
        requests_reporting_cached=sum(o.cached_tokens is not None for o in successes),
    )


def compute_metrics(
    outcomes: Sequence[RequestOutcome],
    duration_s: float,
    percentiles: Sequence[float] = (99.0,),
    goodput_slos_ms: dict[str, float] | None = None,
) -> BenchmarkMetrics:
    successes = [o for o in outcomes if o.success]
    output_lens = [o.output_tokens if o.success else 0 for o in outcomes]
    total_input = sum(o.prompt_len for o in successes)
    total_output = sum(output_lens)
    tpots = [t for t in map(request_tpot, successes) if t is not None]
    samples = {
        "ttft": [o.ttft for o in successes],
        "tpot": tpots,
        "itl": [gap for o in successes for gap in o.itl],
        "e2el": [o.latency for o in successes],
    }

    def per_second(amount: float) -> float:
        return amount / duration_s if duration_s > 0 else 0.0

    return BenchmarkMetrics(
        completed=len(successes),
        failed=len(outcomes) - len(successes),
        total_input=total_input,
        total_output=total_output,
        request_throughput=per_second(len(successes)),
        request_goodput=per_second(good_requests(successes, goodput_slos_ms or {})),
        output_throughput=per_second(total_output),
        total_token_throughput=per_second(total_input + total_output),
        max_output_tokens_per_s=peak_output_tokens_per_s(successes),
        max_concurrent_requests=concurrency_per_second_peak(successes),
        peak_concurrent_requests=peak_concurrency(
            (o.start_time, o.start_time + o.latency) for o in successes
        ),
        stats={name: summarize(values, percentiles) for name, values in samples.items()},
        cache=cache_report(successes),
        output_lens=output_lens,
    )


def concurrency_per_second_peak(successes: Sequence[RequestOutcome]) -> int:
    """vLLM's `max_concurrent_requests` (see module docstring)."""
    if not successes:
        return 0
    first = min(o.start_time for o in successes)
    last = max(o.start_time + o.latency for o in successes)
    buckets = np.zeros(math.ceil(last - first) + 1, dtype=int)
    for o in successes:
        begin, end = int(o.start_time - first), int(o.start_time + o.latency - first)
        buckets[begin : min(end + 1, len(buckets))] += 1
    return int(buckets.max())


def percentile_key(p: float) -> str:
    """vLLM's key word for a percentile: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)
