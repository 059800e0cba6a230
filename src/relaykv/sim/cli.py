"""`relaykv sim`: simulate a P/D cluster running relaykv's own scheduler and cache.

    relaykv sim calibrate --model tiny-hybrid --speculative-tokens 2 --out cpu.json
    relaykv sim --model gpt-oss-20b --hardware h20 --prefill-tp 2 --decode-tp 2 \\
        --link rdma --speculative-tokens 3 --pd-policy all \\
        --dataset-name prefix_repetition --prefix-repetition-prefix-len 65504 \\
        --prefix-repetition-suffix-len 64 --prefix-repetition-num-prefixes 1 \\
        --prefix-repetition-output-len 128 --num-prompts 40 --max-concurrency 8 \\
        --num-warmups 1 --json

Every policy runs on a fresh simulated cluster with the same request stream. With `--json`
the last stdout line is one JSON list, one object per policy (keys: `results.KEYS`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from relaykv.common.workloads import DatasetError, arrival_offsets
from relaykv.kvcache import PD_POLICIES
from relaykv.sim import sim_args
from relaykv.sim.cluster import ClusterSpec, SimCluster
from relaykv.sim.hardware import hardware_spec, link_spec
from relaykv.sim.model_presets import model_spec
from relaykv.sim.plots import plot_run
from relaykv.sim.results import bench_block, public, side_by_side, summarize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=("calibrate",),
        help="calibrate: fit the cost model on this machine's real runner and transport",
    )
    sim_args.add_cluster_arguments(parser)
    sim_args.add_workload_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="last stdout line: a JSON list")
    out.add_argument("--result-dir", default=None, help="write the JSON and a PNG plot here")
    out.add_argument("--disable-tqdm", action="store_true", help="no progress bar on stderr")
    cal = parser.add_argument_group("calibrate")
    cal.add_argument("--out", default=None, help="the calibration file to write")
    cal.add_argument("--kv-transport", default="shm", help="the transport to time (shm, tcp)")
    cal.add_argument(
        "--calibrate-quick", action="store_true", help="fewer, smaller steps, one repeat"
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.action == "calibrate":
        from relaykv.sim.calibration.cli import run_calibration

        if not args.out:
            parser.error("argument --out: calibrate needs --out FILE")
        return run_calibration(args, parser)
    try:
        model = model_spec(args.model)
        hardware = hardware_spec(args.hardware)
        link = link_spec(args.link or args.hardware)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        requests = sim_args.build_requests(args, model.vocab_size)
        offsets = arrival_offsets(len(requests), args.request_rate, args.burstiness, args.seed or 0)
    except DatasetError as exc:
        parser.error(str(exc))
    policies = list(PD_POLICIES) if args.pd_policy == "all" else [args.pd_policy]
    base = sim_args.cluster_spec(args, model, hardware, link, requests, parser)
    results = []
    for policy in policies:
        result = simulate(base, policy, requests, offsets, args)
        results.append(result)
        if not args.json:
            print(bench_block(result), flush=True)
    if not args.json and len(results) > 1:
        print(side_by_side(results))
    if args.result_dir:
        _save(results, args, Path(args.result_dir))
    if args.json:
        print(json.dumps([public(r) for r in results]))
    return 0


def simulate(
    base: ClusterSpec, policy: str, requests: list, offsets: list[float], args: argparse.Namespace
) -> dict[str, Any]:
    """One policy on a fresh cluster with the same request stream."""
    from dataclasses import replace

    t0 = time.perf_counter()
    cluster = SimCluster(replace(base, pd_policy=policy))
    warm_counters: dict[str, dict[str, int]] = {}

    def after_warmup() -> None:
        warm_counters.update(cluster.counters())

    bar = tqdm(
        total=len(requests) + args.num_warmups,
        desc=f"sim {policy}",
        unit="req",
        mininterval=1.0,
        file=sys.stderr,
        disable=getattr(args, "disable_tqdm", True),
    )
    start = cluster.run(
        requests,
        offsets,
        max_concurrency=args.max_concurrency,
        num_warmups=args.num_warmups,
        ignore_eos=True,
        on_measured=after_warmup,
        on_request_done=lambda _: bar.update(1),
    )
    bar.close()
    problems = cluster.check()
    if problems:
        raise RuntimeError("simulated cluster invariants broken: " + "; ".join(problems[:5]))
    return summarize(
        policy, cluster.records, start, warm_counters, cluster.counters(), time.perf_counter() - t0
    )


def _save(results: list[dict[str, Any]], args: argparse.Namespace, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    stem = f"sim-{Path(args.model).name}-{args.dataset_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = where / f"{stem}.json"
    path.write_text(
        json.dumps(
            {
                "args": {
                    k: v
                    for k, v in vars(args).items()
                    if isinstance(v, str | int | float | bool | None)
                },
                "results": results,
            },
            indent=1,
            default=str,
        )
    )
    title = (
        f"{args.model} on {args.hardware} ({args.num_prefill}P TP{args.prefill_tp} + "
        f"{args.num_decode}D TP{args.decode_tp}, {args.link or 'default link'}), "
        f"{args.dataset_name}"
    )
    plot_run(results, where / f"{stem}.png", title)
    if not args.json:
        print(f"results in {path} and {path.with_suffix('.png')}")
