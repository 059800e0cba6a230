"""The printed block and the result JSON keep vLLM's layout and keys."""

from __future__ import annotations

import math
from datetime import datetime

from relaykv.bench.metrics import compute_metrics
from relaykv.bench.serve.report import (
    HEADER,
    RunDescription,
    build_result,
    default_result_filename,
    format_result_block,
)
from tests.bench.test_metrics import outcomes

VLLM_KEYS = {
    "date",
    "backend",
    "model_id",
    "num_prompts",
    "request_rate",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
}


def _run(**kw) -> RunDescription:
    base = dict(
        backend="vllm",
        model_id="org/model",
        num_prompts=4,
        request_rate=math.inf,
        burstiness=1.0,
        max_concurrency=None,
    )
    return RunDescription(**{**base, **kw})


def test_block_header_rows_and_sections() -> None:
    metrics = compute_metrics(outcomes(), 2.0, [99, 99.9], {"ttft": 250})
    block = format_result_block(_run(goodput={"ttft": 250}, max_concurrency=8), metrics, 2.0)
    lines = block.splitlines()
    assert HEADER == "============ Serving Benchmark Result ============"
    assert lines[0] == HEADER and lines[-1] == "=" * 50
    assert f"{'Successful requests:':<40} {3:<10}" in lines
    assert f"{'Benchmark duration (s):':<40} {2.0:<10.2f}" in lines
    assert f"{'Request goodput (req/s):':<40} {1.0:<10.2f}" in lines
    assert f"{'Maximum request concurrency:':<40} {8:<10}" in lines
    assert f"{'P99.9 TTFT (ms):':<40} {metrics.stats['ttft'].percentiles_ms[1][1]:<10.2f}" in lines
    assert "---------------Time to First Token----------------" in lines
    for label in (
        "Request throughput (req/s):",
        "Output token throughput (tok/s):",
        "Mean TTFT (ms):",
        "Median TTFT (ms):",
        "P99 TTFT (ms):",
        "Mean TPOT (ms):",
        "Mean ITL (ms):",
        "Cache hit rate (%):",
    ):
        assert any(line.startswith(label) for line in lines), label
    assert not any(line.startswith("Mean E2EL") for line in lines)  # not selected
    assert not any(line.startswith("Request rate configured") for line in lines)


def test_block_shows_rate_only_when_finite_and_goodput_only_when_asked() -> None:
    block = format_result_block(_run(request_rate=4.0), compute_metrics(outcomes(), 2.0), 2.0)
    assert "Request rate configured (RPS):" in block
    assert "Request goodput" not in block


def test_result_keys() -> None:
    run = _run(percentile_metrics=("ttft", "e2el"), metadata={"tp": "8"})
    metrics = compute_metrics(outcomes(), 2.0, [50, 99])
    result = build_result(run, metrics, 2.0, outcomes(), now=datetime(2025, 1, 2, 3, 4, 5))
    assert set(result) >= VLLM_KEYS
    assert result["date"] == "20250102-030405"
    assert result["request_rate"] == "inf" and result["request_goodput"] is None
    assert result["tp"] == "8"
    for key in (
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p50_ttft_ms",
        "p99_ttft_ms",
        "mean_e2el_ms",
        "p99_e2el_ms",
    ):
        assert key in result, key
    assert "mean_tpot_ms" not in result and "ttfts" not in result
    assert result["cache_report"]["total_cached_tokens"] == 35
    assert result["cache_report"]["cache_hit_rate_pct"] == 35 / 60 * 100
    detailed = build_result(run, metrics, 2.0, outcomes(), detailed=True)
    assert detailed["errors"][3] == "HTTP 500" and detailed["output_lens"] == [4, 2, 1, 0]
    assert detailed["latencies"] == [o.latency for o in outcomes()]
    assert len(detailed["queue_times"]) == 4 and detailed["rtfx"] == 0.0


def test_default_filename_is_vllms() -> None:
    run = _run(max_concurrency=8, label=None)
    assert default_result_filename(run, "20250101-000000") == (
        "vllm-infqps-concurrency8-model-20250101-000000.json"
    )
