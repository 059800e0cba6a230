"""Metric math on synthetic timings against hand-computed values (vLLM's definitions)."""

from __future__ import annotations

import math

import pytest

from relaykv.bench.metrics import (
    compute_metrics,
    peak_concurrency,
    peak_output_tokens_per_s,
    percentile_key,
    summarize,
)
from relaykv.bench.outcome import RequestOutcome


def outcomes() -> list[RequestOutcome]:
    return [
        RequestOutcome(
            success=True,
            start_time=0.0,
            ttft=0.1,
            itl=[0.05, 0.05, 0.1],
            latency=0.3,
            output_tokens=4,
            prompt_len=10,
            cached_tokens=5,
        ),
        RequestOutcome(
            success=True,
            start_time=0.5,
            ttft=0.2,
            itl=[0.1],
            latency=0.3,
            output_tokens=2,
            prompt_len=20,
            cached_tokens=None,
        ),
        RequestOutcome(
            success=True,
            start_time=1.2,
            ttft=0.3,
            itl=[],
            latency=0.3,
            output_tokens=1,
            prompt_len=30,
            cached_tokens=30,
        ),
        RequestOutcome(success=False, start_time=0.1, prompt_len=40, error="HTTP 500"),
    ]


def test_counts_and_throughputs() -> None:
    m = compute_metrics(outcomes(), 2.0)
    assert (m.completed, m.failed, m.total_input, m.total_output) == (3, 1, 60, 7)
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(3.5)
    assert m.total_token_throughput == pytest.approx(33.5)
    assert m.output_lens == [4, 2, 1, 0]


def test_ttft_statistics() -> None:
    ttft = compute_metrics(outcomes(), 2.0, percentiles=[50, 99]).stats["ttft"]
    assert ttft.mean_ms == pytest.approx(200.0)
    assert ttft.median_ms == pytest.approx(200.0)
    assert ttft.std_ms == pytest.approx(math.sqrt(0.02 / 3) * 1000)  # population std
    assert ttft.percentiles_ms == [(50.0, pytest.approx(200.0)), (99.0, pytest.approx(298.0))]


def test_tpot_excludes_single_token_outputs_and_itl_pools_gaps() -> None:
    stats = compute_metrics(outcomes(), 2.0).stats
    # (0.3 - 0.1) / 3 and (0.3 - 0.2) / 1; the 1-token request has no TPOT
    assert stats["tpot"].mean_ms == pytest.approx((0.2 / 3 + 0.1) / 2 * 1000)
    assert stats["itl"].mean_ms == pytest.approx(75.0)
    assert stats["itl"].median_ms == pytest.approx(75.0)
    assert stats["itl"].std_ms == pytest.approx(25.0)
    assert stats["e2el"].mean_ms == pytest.approx(300.0)


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        ({"ttft": 250}, 2),
        ({"tpot": 70}, 2),  # 66.7 ms passes, 100 ms fails, TPOT of a 1-token output is 0
        ({"ttft": 250, "tpot": 70}, 1),
        ({"e2el": 300}, 3),  # the SLO is inclusive
        ({"e2el": 299}, 0),
    ],
)
def test_goodput(slos: dict[str, float], good: int) -> None:
    assert compute_metrics(outcomes(), 2.0, goodput_slos_ms=slos).request_goodput == good / 2.0


def test_peak_output_tokens_per_second_buckets() -> None:
    # token stamps: 0.1 0.15 0.2 0.3 | 0.7 0.8 (all in second 0) | 1.5 (second 1)
    assert peak_output_tokens_per_s([o for o in outcomes() if o.success]) == 6.0
    assert compute_metrics(outcomes(), 2.0).max_output_tokens_per_s == 6.0
    assert peak_output_tokens_per_s([]) == 0.0


def test_peak_concurrency_uses_half_open_intervals() -> None:
    assert peak_concurrency([(0, 2), (1, 3), (2, 4), (2, 5)]) == 3
    assert peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1
    assert peak_concurrency([]) == 0
    assert compute_metrics(outcomes(), 2.0).peak_concurrent_requests == 1


def test_max_concurrent_requests_is_vllms_per_second_count() -> None:
    """vLLM counts a request in every one-second bucket from its start to its end: the two
    sequential requests (0-0.3 s, 0.5-0.8 s) share second 0, so vLLM says 2; exactly 1."""
    m = compute_metrics(outcomes(), 2.0)
    assert (m.max_concurrent_requests, m.peak_concurrent_requests) == (2, 1)
    spread = [RequestOutcome(success=True, start_time=t, latency=0.5) for t in (0, 1.2, 2.4)]
    long = RequestOutcome(success=True, start_time=0.1, latency=2.0)  # seconds 0, 1, 2
    m = compute_metrics([*spread, long], 3.0)
    assert (m.max_concurrent_requests, m.peak_concurrent_requests) == (2, 2)


def test_cache_report_from_usage_cached_tokens() -> None:
    cache = compute_metrics(outcomes(), 2.0).cache
    assert cache.total_prompt_tokens == 60
    assert cache.total_cached_tokens == 35
    assert cache.cache_hit_rate_pct == pytest.approx(35 / 60 * 100)
    assert cache.requests_reporting_cached == 2


def test_all_failed_reports_zeros() -> None:
    m = compute_metrics([RequestOutcome(success=False)], 1.0)
    assert m.completed == 0 and m.failed == 1
    assert m.stats["ttft"].mean_ms == 0.0
    assert m.cache.cache_hit_rate_pct == 0.0
    assert compute_metrics([], 0.0).request_throughput == 0.0


def test_summarize_and_percentile_keys() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0], [25, 90])
    assert s.percentiles_ms == [(25.0, pytest.approx(1750.0)), (90.0, pytest.approx(3700.0))]
    assert percentile_key(99.0) == "99" and percentile_key(99.9) == "99.9"
