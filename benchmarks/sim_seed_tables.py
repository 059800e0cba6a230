"""The tables of the upstream report (vLLM PR #56449, docs/design.md §11; "seed" in this
script's names) re-run at the report's scale in `relaykv sim`.

Scenarios (docs/simulator.md "The upstream report's tables at its scale"): gpt-oss-20b + EAGLE3
on H20 TP2/TP2 and dsv4-flash on H20 TP8/TP8 over RDMA, prefix_repetition 65,504 + 64 with one
prefix, groups c1/output1 (8 requests), c8/output1 (40), c8/output128 (40), each on a fresh
cluster after one same-prefix warmup; and the 64k generated-shared-prefix stress (10 groups x
32 prompts, 64-token questions, 1,500 output tokens, c64, one warmup) on dsv4-flash. Every
policy, plus, on prefix_repetition, `legacy` with `--prefill-prefix-caching off` (the lower
bound of the report's baseline image, see the docs), and `per-group` under the router's
conditional disaggregation (docs/routing.md): with the max suffix of the cost estimate from the
presets ("conditional") and with relaykv router's default of 512 tokens ("conditional 512").
Prints markdown tables with the report's published numbers side by side and writes JSON + one
PNG per table into --output-dir.

    .venv/bin/python benchmarks/sim_seed_tables.py [--output-dir DIR] [--only gpt-oss|dsv4|stress]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from relaykv.common.workloads import arrival_offsets
from relaykv.sim.cli import add_arguments, simulate
from relaykv.sim.hardware import hardware_spec, link_spec
from relaykv.sim.model_presets import model_spec
from relaykv.sim.plots import plot_run
from relaykv.sim.results import public
from relaykv.sim.sim_args import build_requests, cluster_spec

POLICIES = ("legacy", "replay-slack", "exact", "per-group")
PR = [
    "--dataset-name",
    "prefix_repetition",
    "--prefix-repetition-prefix-len",
    "65504",
    "--prefix-repetition-suffix-len",
    "64",
    "--prefix-repetition-num-prefixes",
    "1",
    "--num-warmups",
    "1",
]
GROUPS = {"c1/output1": (1, 1, 8), "c8/output1": (8, 1, 40), "c8/output128": (8, 128, 40)}
SETUPS = {
    "gpt-oss": [
        "--model",
        "gpt-oss-20b",
        "--hardware",
        "h20",
        "--prefill-tp",
        "2",
        "--decode-tp",
        "2",
        "--link",
        "rdma",
        "--speculative-tokens",
        "3",
        "--acceptance-rate",
        "0.6",
    ],
    "dsv4": [
        "--model",
        "dsv4-flash",
        "--hardware",
        "h20",
        "--prefill-tp",
        "8",
        "--decode-tp",
        "8",
        "--link",
        "rdma",
        "--speculative-tokens",
        "5",
        "--acceptance-rate",
        "0.6",
    ],
}
STRESS = [
    "--dataset-name",
    "generated-shared-prefix",
    "--gsp-num-groups",
    "10",
    "--gsp-prompts-per-group",
    "32",
    "--gsp-system-prompt-len",
    "65536",
    "--gsp-question-len",
    "64",
    "--gsp-output-len",
    "1500",
    "--max-concurrency",
    "64",
    "--num-warmups",
    "1",
]
# The upstream report's published numbers: (baseline, PR) per group and metric.
SEED = {
    ("dsv4", "c1/output1"): {
        "request_throughput": (0.346, 1.556),
        "mean_ttft_ms": (2891.2, 642.4),
        "p99_ttft_ms": (9605.2, 652.3),
    },
    ("dsv4", "c8/output1"): {
        "request_throughput": (1.285, 5.657),
        "mean_ttft_ms": (5524.0, 1114.8),
        "p99_ttft_ms": (19013.5, 3402.5),
    },
    ("dsv4", "c8/output128"): {
        "output_throughput": (315.5, 755.3),
        "mean_ttft_ms": (2665.2, 821.9),
        "p99_ttft_ms": (10224.6, 1185.7),
        "mean_tpot_ms": (3.81, 3.37),
    },
    ("gpt-oss", "c1/output1"): {
        "request_throughput": (0.498, 1.255),
        "mean_ttft_ms": (2008.55, 796.92),
        "p99_ttft_ms": (4379.61, 1330.14),
    },
    ("gpt-oss", "c8/output1"): {
        "request_throughput": (3.551, 4.901),
        "mean_ttft_ms": (2134.78, 1515.96),
        "p99_ttft_ms": (5801.49, 2577.43),
    },
    ("gpt-oss", "c8/output128"): {
        "output_throughput": (315.07, 395.64),
        "mean_ttft_ms": (1745.22, 1094.30),
        "p99_ttft_ms": (6096.41, 2691.77),
        "mean_tpot_ms": (10.56, 10.48),
    },
    ("dsv4", "stress"): {
        "request_throughput": (None, 2.16),
        "output_throughput": (None, 3247.40),
        "mean_ttft_ms": (None, 15817.56),
        "p99_ttft_ms": (None, 27784.90),
        "mean_tpot_ms": (None, 8.14),
        "d_local_hit_share": (None, 0.0031),
    },
}


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def run_table(name: str, argv: list[str], out: Path, image: bool) -> tuple[list[dict], float]:
    args = _args(argv)
    model, hw, link = model_spec(args.model), hardware_spec(args.hardware), link_spec(args.link)
    requests = build_requests(args, model.vocab_size)
    offsets = arrival_offsets(len(requests), args.request_rate, args.burstiness, args.seed or 0)
    base = cluster_spec(args, model, hw, link, requests, argparse.ArgumentParser())
    t0 = time.perf_counter()
    results = [simulate(base, p, requests, offsets, args) for p in POLICIES]
    for label, max_suffix in (("conditional", None), ("conditional 512", 512)):
        spec = replace(base, disaggregation="conditional", conditional_max_suffix=max_suffix)
        results.append(simulate(spec, "per-group", requests, offsets, args))
        results[-1]["pd_policy"] = label
        results[-1]["max_suffix"] = spec.conditional_rule().max_suffix
    if image:
        off = _args([*argv, "--prefill-prefix-caching", "off"])
        spec = cluster_spec(off, model, hw, link, requests, argparse.ArgumentParser())
        results.append(simulate(spec, "legacy", requests, offsets, off))
        results[-1]["pd_policy"] = "legacy, P APC off"
    wall = time.perf_counter() - t0
    slug = name.replace("/", "-")
    (out / f"{slug}.json").write_text(json.dumps([public(r) for r in results], indent=1))
    plot_run(results, out / f"{slug}.png", f"relaykv sim: {name}")
    return results, wall


def _fmt(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    if key == "d_local_hit_share":
        return f"{100 * value:.1f}%"
    return f"{value:.3f}" if key.endswith("throughput") and value < 10 else f"{value:.1f}"


def table(setup: str, group: str, results: list[dict]) -> str:
    seed = SEED.get((setup, group), {})
    keys = list(seed) or ["mean_ttft_ms", "p99_ttft_ms"]
    if group != "stress" and "mean_tpot_ms" not in keys and group.endswith("output128"):
        keys.append("mean_tpot_ms")
    for extra in ("d_local_hit_share",):
        if extra not in keys:
            keys.append(extra)
    names = [r["pd_policy"] for r in results]
    lines = [
        f"| {setup} {group} | seed baseline | seed PR | " + " | ".join(names) + " |",
        "|---" * (3 + len(names)) + "|",
    ]
    for key in keys:
        base, pr = seed.get(key, (None, None))
        sims = " | ".join(_fmt(r[key], key) for r in results)
        lines.append(f"| {key} | {_fmt(base, key)} | {_fmt(pr, key)} | {sims} |")
    mb = " | ".join(
        f"{r['d_kv_bytes_received'] / 1e6 / max(1, r['completed']):.1f}" for r in results
    )
    lines.append(f"| D MB received / request | - | - | {mb} |")
    local = " | ".join(
        f"{r['local_requests']} (max suffix {r['max_suffix']})" if "max_suffix" in r else "-"
        for r in results
    )
    lines.append(f"| local requests (conditional) | - | - | {local} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default="sim-seed-tables")
    parser.add_argument("--only", choices=("gpt-oss", "dsv4", "stress"), default=None)
    opts = parser.parse_args()
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for setup, flags in SETUPS.items():
        for group, (conc, output, n) in GROUPS.items():
            if opts.only not in (None, setup):
                continue
            argv = [
                *flags,
                *PR,
                "--max-concurrency",
                str(conc),
                "--num-prompts",
                str(n),
                "--prefix-repetition-output-len",
                str(output),
            ]
            runs.append((setup, group, argv))
    if opts.only in (None, "stress"):
        runs.append(("dsv4", "stress", [*SETUPS["dsv4"], *STRESS]))
    for setup, group, argv in runs:
        results, wall = run_table(f"{setup} {group}", argv, out, image=group != "stress")
        print(table(setup, group, results))
        print(f"\n(simulated {len(results)} runs in {wall:.1f} s wall)\n", flush=True)


if __name__ == "__main__":
    main()
