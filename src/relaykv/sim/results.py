"""One policy's simulated run as `bench serve` reports it, plus the engines' counters.

Metric meanings follow `bench serve` (docs/benchmarking.md): TTFT from send to the first streamed
token (D's first token in P/D), TPOT = (e2e - TTFT) / (output tokens - 1) over requests
with more than one token, duration from the first send of the measured phase to its last
completion, throughputs over that duration. Counters (`d_local_hit_tokens` = D's
`vllm:prefix_cache_hits`, `d_external_hit_tokens`, `p_local_hit_tokens`,
`d_kv_bytes_received`) cover the measured phase only (warmups excluded), as a scrape
before and after it would.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from relaykv.sim.cluster import RequestRecord

KEYS = (
    "pd_policy",
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "d_local_hit_tokens",
    "d_external_hit_tokens",
    "p_local_hit_tokens",
    "d_kv_bytes_received",
    "sim_wall_seconds",
)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarize(
    policy: str,
    records: list[RequestRecord],
    start: float,
    before: dict[str, dict[str, int]],
    after: dict[str, dict[str, int]],
    wall_seconds: float,
) -> dict[str, Any]:
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok and r.first_token_time is not None]
    ttft = [1000 * (r.first_token_time - r.send_time) for r in ok]  # type: ignore[operator]
    tpot = [
        1000 * (r.end_time - r.first_token_time) / (r.output_tokens - 1)  # type: ignore[operator]
        for r in ok
        if r.output_tokens > 1
    ]
    e2el = [1000 * (r.end_time - r.send_time) for r in ok]  # type: ignore[operator]
    end = max((r.end_time or start for r in measured), default=start)
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)

    def delta(role: str, key: str) -> int:
        return after.get(role, {}).get(key, 0) - before.get(role, {}).get(key, 0)

    d_queries = delta("decode", "prefix_cache_queries")
    p_queries = delta("prefill", "prefix_cache_queries")
    drafts = delta("decode", "draft_tokens")
    result: dict[str, Any] = {
        "pd_policy": policy,
        "completed": len(ok),
        "local_requests": sum(1 for r in ok if r.path == "local"),
        "failed": len(measured) - len(ok),
        "duration": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_input_tokens": sum(r.prompt_len for r in ok),
        "total_output_tokens": out_tokens,
        "mean_ttft_ms": float(np.mean(ttft)) if ttft else 0.0,
        "median_ttft_ms": _pct(ttft, 50),
        "p99_ttft_ms": _pct(ttft, 99),
        "mean_tpot_ms": float(np.mean(tpot)) if tpot else 0.0,
        "median_tpot_ms": _pct(tpot, 50),
        "p99_tpot_ms": _pct(tpot, 99),
        "mean_e2el_ms": float(np.mean(e2el)) if e2el else 0.0,
        "d_local_hit_tokens": delta("decode", "prefix_cache_hits"),
        "d_external_hit_tokens": delta("decode", "external_prefix_cache_hits"),
        "d_prefix_cache_queries": d_queries,
        "d_local_hit_share": delta("decode", "prefix_cache_hits") / d_queries if d_queries else 0.0,
        "p_local_hit_tokens": delta("prefill", "prefix_cache_hits"),
        "p_prefix_cache_queries": p_queries,
        "d_kv_bytes_received": delta("decode", "kv_bytes_received"),
        "d_loads_coalesced": delta("decode", "loads_coalesced"),
        "preemptions": delta("decode", "preemptions") + delta("prefill", "preemptions"),
        "acceptance_rate": delta("decode", "accepted_tokens") / drafts if drafts else 0.0,
        "sim_wall_seconds": wall_seconds,
        "ttfts_ms": ttft,
    }
    return result


def public(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON object of one policy (per-request arrays left out)."""
    return {k: v for k, v in result.items() if k != "ttfts_ms"}


def bench_block(r: dict[str, Any]) -> str:
    """The `bench serve` style result block of one policy."""
    mb = r["d_kv_bytes_received"] / 1e6
    rows = [
        ("Successful requests:", f"{r['completed']}"),
        ("Failed requests:", f"{r['failed']}"),
        ("Benchmark duration (s):", f"{r['duration']:.2f}"),
        ("Total input tokens:", f"{r['total_input_tokens']}"),
        ("Total generated tokens:", f"{r['total_output_tokens']}"),
        ("Request throughput (req/s):", f"{r['request_throughput']:.2f}"),
        ("Output token throughput (tok/s):", f"{r['output_throughput']:.2f}"),
        ("Mean TTFT (ms):", f"{r['mean_ttft_ms']:.2f}"),
        ("Median TTFT (ms):", f"{r['median_ttft_ms']:.2f}"),
        ("P99 TTFT (ms):", f"{r['p99_ttft_ms']:.2f}"),
        ("Mean TPOT (ms):", f"{r['mean_tpot_ms']:.2f}"),
        ("P99 TPOT (ms):", f"{r['p99_tpot_ms']:.2f}"),
        ("D local hit tokens:", f"{r['d_local_hit_tokens']} ({100 * r['d_local_hit_share']:.1f}%)"),
        ("D external hit tokens:", f"{r['d_external_hit_tokens']}"),
        ("P local hit tokens:", f"{r['p_local_hit_tokens']}"),
        ("D KV received (MB):", f"{mb:.1f}"),
        ("Simulated in (wall s):", f"{r['sim_wall_seconds']:.2f}"),
    ]
    title = f" Simulated result: --pd-policy {r['pd_policy']} "
    lines = [f"{title:=^60}"] + [f"{k:<40}{v:>20}" for k, v in rows] + ["=" * 60]
    return "\n".join(lines)


def side_by_side(results: list[dict[str, Any]]) -> str:
    cols = (
        "mean_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "output_throughput",
        "d_local_hit_share",
        "d_kv_bytes_received",
    )
    head = [
        "policy",
        "mean TTFT ms",
        "P99 TTFT ms",
        "mean TPOT ms",
        "out tok/s",
        "D local hit",
        "D KV MB",
    ]
    rows = [head]
    for r in results:
        vals = [r[c] for c in cols]
        rows.append(
            [
                r["pd_policy"],
                f"{vals[0]:.1f}",
                f"{vals[1]:.1f}",
                f"{vals[2]:.2f}",
                f"{vals[3]:.1f}",
                f"{100 * vals[4]:.1f}%",
                f"{vals[5] / 1e6:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )
