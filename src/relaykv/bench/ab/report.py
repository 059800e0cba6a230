"""A/B/A tables: every metric per run, baseline vs candidates, change and baseline spread.

* Baseline value = mean over the baseline configuration's runs (A1, A2, ...); a candidate's
  value = mean over its runs. Missing values (a counter no engine exposes) are skipped.
* change % = (candidate - baseline) / |baseline| * 100; undefined when the baseline is 0
  (unless both are 0: 0 %).
* spread % = (max - min) / |mean| * 100 over the baseline runs: the drift between A1 and A2,
  the yardstick a change must beat. Needs two or more baseline runs.
* A change no larger than a non-zero spread is printed as "within noise", never as a signed
  percentage (the JSON keeps the number and says `within_noise`): A1 and A2 ran the same
  configuration and differ by that much already.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# (where, key, display name); where = "result" (vLLM keys), "cache", "decode"/"prefill"
# counters, "outputs" (the group's generated texts against the first run's: greedy runs of
# every configuration must agree), "host" (the host's CPU while the group ran: a run whose
# CPUs were stolen by other guests is slower for it, bench/ab/host_cpu.py), or "probe" (per
# phase)
WORKLOAD_METRICS: tuple[tuple[str, str, str], ...] = (
    ("result", "completed", "Successful requests"),
    ("result", "failed", "Failed requests"),
    ("result", "request_throughput", "Request throughput (req/s)"),
    ("result", "output_throughput", "Output throughput (tok/s)"),
    ("result", "mean_ttft_ms", "Mean TTFT (ms)"),
    ("result", "median_ttft_ms", "Median TTFT (ms)"),
    ("result", "p99_ttft_ms", "P99 TTFT (ms)"),
    ("result", "mean_tpot_ms", "Mean TPOT (ms)"),
    ("result", "mean_itl_ms", "Mean ITL (ms)"),
    ("result", "p99_itl_ms", "P99 ITL (ms)"),
    ("result", "mean_e2el_ms", "Mean E2EL (ms)"),
    ("outputs", "differing_outputs", "Outputs differing from the first run"),
    ("cache", "cache_hit_rate_pct", "Cached prompt tokens (usage, %)"),
    ("decode", "local_hit_tokens", "D local hit tokens"),
    ("decode", "external_hit_tokens", "D external hit tokens"),
    ("decode", "kv_bytes_received", "D KV bytes received"),
    ("decode", "local_requests", "D local requests (prefilled on D)"),
    ("prefill", "local_hit_tokens", "P local hit tokens"),
    ("host", "steal_pct", "Host CPU steal (%)"),
    ("host", "busy_pct", "Host CPU busy (%)"),
)
PROBE_METRICS: tuple[tuple[str, str], ...] = (
    ("requests_ok", "Probe requests ok"),
    ("local_hit_tokens", "D local hit tokens"),
    ("external_hit_tokens", "D external hit tokens"),
    ("kv_bytes_received", "D KV bytes received"),
)


@dataclass(slots=True)
class Row:
    group: str
    metric: str
    name: str
    values: dict[str, float | None]
    baseline: float | None
    candidates: dict[str, float | None]
    change_pct: dict[str, float | None]
    spread_pct: float | None
    integer: bool = False  # counts: shown without decimals
    within_noise: dict[str, bool] = field(default_factory=dict)


def is_count(metric: str) -> bool:
    """Request counts, token counters and byte counters (integers, unlike rates)."""
    return metric in (
        "completed", "failed", "requests_ok", "differing_outputs", "local_requests"
    ) or metric.endswith(("_tokens", "_received", "_sent"))


def run_values(run: dict[str, Any]) -> dict[tuple[str, str], tuple[str, float | None]]:
    """(group, metric) -> (display name, value) for one run record."""
    out: dict[tuple[str, str], tuple[str, float | None]] = {}
    for phase in (run.get("probe") or {}).get("phases", []):
        for key, name in PROBE_METRICS:
            out[(f"probe/{phase['name']}", key)] = (name, float(phase[key]))
    for group in run.get("groups", []):
        for where, key, name in WORKLOAD_METRICS:
            if where == "result":
                value = group["result"].get(key)
            elif where == "cache":
                value = group["result"].get("cache_report", {}).get(key)
            elif where == "outputs":
                value = group.get(key)
            elif where == "host":
                value = (group.get("host") or {}).get(key)
            else:
                value = group.get("counters", {}).get(where, {}).get(key)
            metric = key if where in ("result", "cache", "outputs") else f"{where}_{key}"
            out[(group["group"], metric)] = (name, None if value is None else float(value))
    return out


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def change_pct(baseline: float | None, candidate: float | None) -> float | None:
    if baseline is None or candidate is None:
        return None
    if baseline == 0:
        return 0.0 if candidate == 0 else None
    return (candidate - baseline) / abs(baseline) * 100


def spread_pct(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    mean = sum(present) / len(present)
    if mean == 0:
        return 0.0 if max(present) == min(present) else None
    return (max(present) - min(present)) / abs(mean) * 100


def within_noise(change: float | None, spread: float | None) -> bool:
    """True if `change` (%) cannot be told apart from the baseline's own run-to-run spread."""
    if change is None or spread is None:
        return False
    return spread > 0 and abs(change) <= spread


def build_rows(runs: list[dict[str, Any]], baseline: str) -> list[Row]:
    per_run = [(run["label"], run["config"], run_values(run)) for run in runs]
    configs = list(dict.fromkeys(config for _, config, _ in per_run))
    keys: dict[tuple[str, str], str] = {}
    for _, _, run_vals in per_run:
        for key, (name, _) in run_vals.items():
            keys.setdefault(key, name)
    rows = []
    for (group, metric), name in keys.items():
        values = {label: vals.get((group, metric), ("", None))[1] for label, _, vals in per_run}
        by_config = {
            config: _mean([values[label] for label, c, _ in per_run if c == config])
            for config in configs
        }
        base_runs = [values[label] for label, c, _ in per_run if c == baseline]
        candidates = {c: v for c, v in by_config.items() if c != baseline}
        changes = {c: change_pct(by_config.get(baseline), v) for c, v in candidates.items()}
        spread = spread_pct(base_runs)
        rows.append(
            Row(
                group=group,
                metric=metric,
                name=name,
                values=values,
                baseline=by_config.get(baseline),
                candidates=candidates,
                change_pct=changes,
                spread_pct=spread,
                integer=is_count(metric),
                within_noise={c: within_noise(v, spread) for c, v in changes.items()},
            )
        )
    return rows


def fmt_value(value: float | None, integer: bool = False) -> str:
    if value is None:
        return "n/a"
    if integer and value == int(value):
        return f"{int(value):,}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"


def fmt_pct(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def markdown_table(rows: list[Row], runs: list[dict[str, Any]], baseline: str) -> str:
    labels = [f"{run['label']} {run['config']}" for run in runs]
    base_labels = [run["label"] for run in runs if run["config"] == baseline]
    candidates = list(rows[0].candidates) if rows else []
    spread_title = "/".join(base_labels) + " spread"
    header = ["Group", "Metric", *labels, f"Baseline ({baseline})"]
    for cand in candidates:
        header += [cand, f"Change ({cand})"]
    header.append(spread_title)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [
            row.group,
            row.name,
            *(fmt_value(v, row.integer) for v in row.values.values()),
            fmt_value(row.baseline, row.integer),
        ]
        for cand in candidates:
            change = "within noise" if row.within_noise[cand] else fmt_pct(row.change_pct[cand])
            cells += [fmt_value(row.candidates[cand], row.integer), change]
        cells.append(fmt_pct(row.spread_pct, signed=False))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_tables(
    rows: list[Row], runs: list[dict[str, Any]], baseline: str, out_dir: Path
) -> tuple[Path, Path]:
    md = out_dir / "ab_table.md"
    md.write_text(markdown_table(rows, runs, baseline))
    js = out_dir / "ab_table.json"
    js.write_text(
        json.dumps(
            {
                "baseline": baseline,
                "runs": [{"label": r["label"], "config": r["config"]} for r in runs],
                "rows": [asdict(row) for row in rows],
            },
            indent=1,
        )
    )
    return md, js
