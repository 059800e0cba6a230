"""TTFT and KV bytes per request under each P/D policy (issue: P/D disaggregation).

The upstream report's (vLLM PR #56449) prefix_repetition workload scaled to this CPU (one
8,192-token prefix, 64-token suffix, one same-prefix warmup per group), through a local P/D
cluster per policy started by `relaykv up`, in one `relaykv bench ab` run so every policy is
measured on a fresh cluster and the first policy runs again at the end to expose drift.
Prints, per policy and group, the mean/P99 TTFT, the KV bytes the decode engine received per
request and its local hit rate, with the change against `legacy` (the baseline run in the same
process).

    .venv/bin/python benchmarks/bench_pd.py [--model tiny-hybrid] [--output-dir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from relaykv.cli import main as relaykv

POLICIES = ("legacy", "replay-slack", "exact", "per-group")


def run_ab(args: argparse.Namespace) -> Path:
    out = Path(args.output_dir)
    up = (
        f"{shlex.quote(sys.executable)} -m relaykv up --model {args.model} "
        f"--speculative-tokens {args.speculative_tokens} --kv-transport {args.kv_transport} "
        f"--num-blocks {args.num_blocks} --max-model-len {args.prefix_len + 1024}"
    )
    groups = (
        ["c1/output1:4", "c8/output1:16"]
        if args.quick
        else ["c1/output1:8", "c8/output1:40", "c8/output32:40"]
    )
    argv = [
        "bench",
        "ab",
        "--configs",
        *(f"{p}=--pd-policy {p}" for p in POLICIES),
        "--order",
        "/".join((*POLICIES, POLICIES[0])),
        "--up-cmd",
        up,
        "--groups",
        *groups,
        "--prefix-len",
        str(args.prefix_len),
        "--suffix-len",
        "64",
        "--output-dir",
        str(out),
    ]
    code = relaykv(argv)
    if code != 0:
        raise SystemExit(code)
    return out


def summarize(out: Path) -> str:
    runs = json.loads((out / "ab_runs.json").read_text())["runs"]
    rows = []
    baseline: dict[str, tuple[float, float]] = {}
    for run in runs:
        if run["config"] == POLICIES[0] and run["label"] != "A1":
            continue  # the closing baseline run is for drift; the table reports A1
        for group in run["groups"]:
            res, decode = group["result"], group.get("counters", {}).get("decode", {})
            done = max(1, res["completed"])
            received = decode.get("kv_bytes_received", 0) / done
            local = decode.get("local_hit_tokens", 0)
            hit = 100.0 * local / max(1, res["total_input_tokens"])
            key = group["group"]
            if run["config"] == POLICIES[0]:
                baseline[key] = (res["mean_ttft_ms"], received)
            base_ttft, base_bytes = baseline.get(key, (res["mean_ttft_ms"], received))
            rows.append(
                f"| {run['config']} | {key} | {res['mean_ttft_ms']:.1f} | {res['p99_ttft_ms']:.1f}"
                f" | {100 * (res['mean_ttft_ms'] / base_ttft - 1):+.1f}% | {received / 1e6:.2f}"
                f" | {100 * (received / base_bytes - 1) if base_bytes else 0:+.1f}% | {hit:.1f}% |"
            )
    header = (
        "| policy | group | mean TTFT ms | P99 TTFT ms | TTFT vs legacy | MB received/req"
        " | bytes vs legacy | D local hit |\n|---|---|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-hybrid")
    parser.add_argument("--speculative-tokens", type=int, default=2)
    parser.add_argument("--kv-transport", default="shm")
    parser.add_argument("--num-blocks", type=int, default=3000)
    parser.add_argument("--prefix-len", type=int, default=8192)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--output-dir", default="results/bench_pd")
    args = parser.parse_args()
    out = run_ab(args)
    table = summarize(out)
    (out / "pd_policies.md").write_text(table + "\n")
    print(table)
    print(f"\nplots and full tables: {out}")


if __name__ == "__main__":
    main()
