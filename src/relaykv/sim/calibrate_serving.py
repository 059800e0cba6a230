"""The serving overheads a runner-only fit cannot see (docs/simulator.md "Calibration").

A served token costs more than the runner's step: the engine's scheduler, its async loop,
streaming through the router, the client. `relaykv sim calibrate` measures them on a real
local cluster (`relaykv up`, single-threaded engines) with `relaykv bench serve` on its
own workload (random prompts at concurrency 1: not the validation workloads), simulates
the same run with the runner-only fit, and attributes the difference:

* mean TPOT: linear in the per-step overhead, so two simulations (+0 and +10 ms) give the
  extra step overhead that matches the measured TPOT;
* mean TTFT: what is left after that is the two HTTP hops (`request_overhead_s` each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from relaykv.sim.hardware import HardwareSpec, LinkSpec

WORKLOAD = [
    "--dataset-name",
    "random",
    "--random-input-len",
    "768",
    "--random-output-len",
    "48",
    "--num-prompts",
    "4",
    "--max-concurrency",
    "1",
    "--seed",
    "7",
]
ENGINE = ["--num-blocks", "2000", "--max-model-len", "2048"]


def measure_serving(model: str, k: int) -> dict[str, Any]:
    """Mean TTFT / TPOT of `WORKLOAD` on a real local P/D cluster (`bench serve` result)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    up = [
        sys.executable,
        "-m",
        "relaykv",
        "up",
        "--json",
        "--model",
        model,
        "--speculative-tokens",
        str(k),
        *ENGINE,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            up,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            router = None
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{") and '"router"' in line:
                    router = json.loads(line)["router"]
                    break
            if router is None:
                raise RuntimeError("relaykv up exited before printing its cluster JSON line")
            bench = [
                sys.executable,
                "-m",
                "relaykv",
                "bench",
                "serve",
                "--base-url",
                router,
                "--ignore-eos",
                "--disable-tqdm",
                "--save-result",
                "--result-dir",
                tmp,
                "--result-filename",
                "serving.json",
                *WORKLOAD,
            ]
            subprocess.run(bench, check=True, capture_output=True, text=True, env=env)
            return json.loads((Path(tmp) / "serving.json").read_text())
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _simulate(
    model: str, k: int, hw: HardwareSpec, link: LinkSpec, acceptance: float
) -> dict[str, Any]:
    from relaykv.sim.cli import add_arguments, simulate
    from relaykv.sim.model_presets import model_spec
    from relaykv.sim.sim_args import build_requests, cluster_spec
    from relaykv.sim.workload import arrival_offsets

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--model",
            model,
            "--speculative-tokens",
            str(k),
            "--pd-policy",
            "per-group",
            "--acceptance-rate",
            str(acceptance),
            *ENGINE,
            *WORKLOAD,
        ]
    )
    spec = model_spec(model)
    requests = build_requests(args, spec.vocab_size)
    offsets = arrival_offsets(len(requests), args.request_rate, args.burstiness, 7)
    base = cluster_spec(args, spec, hw, link, requests, parser)
    return simulate(base, "per-group", requests, offsets, args)


def fit_serving(
    model: str,
    k: int,
    hw: HardwareSpec,
    link: LinkSpec,
    acceptance: float,
    measured: dict[str, Any],
) -> HardwareSpec:
    """`hw` with the step and request overheads that reproduce `measured`."""

    def run(extra: float, req: float) -> dict[str, Any]:
        trial = replace(hw, step_overhead_s=hw.step_overhead_s + extra, request_overhead_s=req)
        return _simulate(model, k, trial, link, acceptance)

    base, plus = run(0.0, 0.0), run(0.01, 0.0)
    slope = (plus["mean_tpot_ms"] - base["mean_tpot_ms"]) / 0.01
    extra = 0.0
    if slope > 0:
        extra = max(0.0, (measured["mean_tpot_ms"] - base["mean_tpot_ms"]) / slope)
    fitted = run(extra, 0.0)
    hops = max(0.0, (measured["mean_ttft_ms"] - fitted["mean_ttft_ms"]) / 1000 / 2)
    return replace(hw, step_overhead_s=hw.step_overhead_s + extra, request_overhead_s=hops)
