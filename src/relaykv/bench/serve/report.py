"""The printed result block and the result JSON of `bench serve` (vLLM's layout and keys).

The block is vLLM's: a 50-column `=` header ` Serving Benchmark Result `, rows formatted
`{:<40} {:<10}`, one `-` section per selected metric with `Mean X (ms):`, `Median X (ms):`
and `P{p} X (ms):` rows, then a closing rule. relaykv adds one section, the SGLang-style
cache report, before the closing rule. The JSON carries vLLM's keys
(docs/benchmarking.md "Result JSON") plus
`cache_report`; per-request arrays only with `--save-detailed`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from relaykv.bench.metrics import METRIC_LABELS, BenchmarkMetrics, percentile_key
from relaykv.bench.outcome import RequestOutcome

HEADER = "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")
DETAILED_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "queue_times",
    "start_times",
    "generated_texts",
    "errors",
)


@dataclass(slots=True)
class RunDescription:
    backend: str
    model_id: str
    num_prompts: int
    request_rate: float
    burstiness: float
    max_concurrency: int | None
    label: str | None = None
    tokenizer_id: str | None = None
    goodput: dict[str, float] = field(default_factory=dict)
    percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl")
    metadata: dict[str, str] = field(default_factory=dict)


def _row(label: str, value: object, fmt: str = "") -> str:
    return f"{label:<40} {value:<10{fmt}}"


def format_result_block(run: RunDescription, metrics: BenchmarkMetrics, duration_s: float) -> str:
    lines = [
        HEADER,
        _row("Successful requests:", metrics.completed),
        _row("Failed requests:", metrics.failed),
    ]
    if run.max_concurrency is not None:
        lines.append(_row("Maximum request concurrency:", run.max_concurrency))
    if not math.isinf(run.request_rate):
        lines.append(_row("Request rate configured (RPS):", run.request_rate, ".2f"))
    lines += [
        _row("Benchmark duration (s):", duration_s, ".2f"),
        _row("Total input tokens:", metrics.total_input),
        _row("Total generated tokens:", metrics.total_output),
        _row("Request throughput (req/s):", metrics.request_throughput, ".2f"),
    ]
    if run.goodput:
        lines.append(_row("Request goodput (req/s):", metrics.request_goodput, ".2f"))
    lines += [
        _row("Output token throughput (tok/s):", metrics.output_throughput, ".2f"),
        _row("Peak output token throughput (tok/s):", metrics.max_output_tokens_per_s, ".2f"),
        _row("Peak concurrent requests:", float(metrics.max_concurrent_requests), ".2f"),
        _row("Total token throughput (tok/s):", metrics.total_token_throughput, ".2f"),
    ]
    for name in run.percentile_metrics:
        short, title = METRIC_LABELS[name]
        stats = metrics.stats[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines.append(_row(f"Mean {short} (ms):", stats.mean_ms, ".2f"))
        lines.append(_row(f"Median {short} (ms):", stats.median_ms, ".2f"))
        for p, value in stats.percentiles_ms:
            lines.append(_row(f"P{percentile_key(p)} {short} (ms):", value, ".2f"))
    cache = metrics.cache
    lines.append("{s:{c}^{n}}".format(s="Prefix Cache (usage.cached_tokens)", n=50, c="-"))
    lines.append(_row("Total prompt tokens:", cache.total_prompt_tokens))
    lines.append(_row("Total cached tokens:", cache.total_cached_tokens))
    lines.append(_row("Cache hit rate (%):", cache.cache_hit_rate_pct, ".2f"))
    lines.append("=" * 50)
    return "\n".join(lines)


def build_result(
    run: RunDescription,
    metrics: BenchmarkMetrics,
    duration_s: float,
    outcomes: Sequence[RequestOutcome],
    *,
    detailed: bool = False,
    now: datetime | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "date": (now or datetime.now()).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": run.backend,
        "backend": run.backend,
        "label": run.label,
        "model_id": run.model_id,
        "tokenizer_id": run.tokenizer_id,
        "num_prompts": run.num_prompts,
        **run.metadata,
        "request_rate": run.request_rate if not math.isinf(run.request_rate) else "inf",
        "burstiness": run.burstiness,
        "max_concurrency": run.max_concurrency,
        "duration": duration_s,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "total_input_tokens": metrics.total_input,
        "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput if run.goodput else None,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
        "max_output_tokens_per_s": metrics.max_output_tokens_per_s,
        "max_concurrent_requests": metrics.max_concurrent_requests,
        "peak_concurrent_requests": metrics.peak_concurrent_requests,
        # vLLM's real-time factor: seconds of input audio per second of benchmark (text: 0).
        "rtfx": 0.0,
    }
    for name in run.percentile_metrics:
        stats = metrics.stats[name]
        result[f"mean_{name}_ms"] = stats.mean_ms
        result[f"median_{name}_ms"] = stats.median_ms
        result[f"std_{name}_ms"] = stats.std_ms
        for p, value in stats.percentiles_ms:
            result[f"p{percentile_key(p)}_{name}_ms"] = value
    result["cache_report"] = metrics.cache.as_dict()
    if detailed:
        result.update(
            {
                "input_lens": [o.prompt_len for o in outcomes],
                "output_lens": metrics.output_lens,
                "ttfts": [o.ttft for o in outcomes],
                "itls": [o.itl for o in outcomes],
                "latencies": [o.latency for o in outcomes],
                "queue_times": [o.client_queue_time for o in outcomes],
                "start_times": [o.start_time for o in outcomes],
                "generated_texts": [o.generated_text for o in outcomes],
                "errors": [o.error for o in outcomes],
            }
        )
    return result


def default_result_filename(run: RunDescription, date: str) -> str:
    """vLLM's `{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json`."""
    concurrency = f"-concurrency{run.max_concurrency}" if run.max_concurrency is not None else ""
    model = run.model_id.split("/")[-1]
    return f"{run.label or run.backend}-{run.request_rate}qps{concurrency}-{model}-{date}.json"


def write_result(result: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return path
