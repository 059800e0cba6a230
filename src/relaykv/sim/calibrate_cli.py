"""`relaykv sim calibrate --model M --out FILE`: measure this machine, fit, write the file.

1. The real model runner times `calibrate.calibration_steps` (prefills at several lengths
   and cached fractions, decode batches of 1-8 at several contexts, a mixed step) in a
   subprocess (`python -m relaykv.model.step_timing`: only the model layer loads models).
2. The chosen transport (`--kv-transport`, default shm) times reads of 1 to 256 pages of
   the model's geometry between two real endpoints in this process.
3. `calibrate_serving` measures the serving overheads on a real local cluster and fits
   them (per-step and per-hop seconds on top of the runner).
4. `calibrate.fit_hardware` / `fit_link` fit the cost model; the file holds the fitted
   `HardwareSpec` fields, a `link`, the measurements and the fit's relative errors. Use it
   as `relaykv sim --hardware FILE` (its link is the default `--link`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from relaykv.sim.calibrate import calibration_steps, fit_hardware, fit_link, relative_errors
from relaykv.sim.calibrate_serving import fit_serving, measure_serving
from relaykv.sim.hardware import HardwareSpec
from relaykv.sim.model_presets import model_spec
from relaykv.sim.models import ModelSpec

# relaykv serve's defaults on a CPU host: 1 GiB of KV pages, 2,048 tokens per step.
CPU_BASE = HardwareSpec(
    "cpu", 1.0, 1.0, float(1 << 30), kv_cache_memory=float(1 << 30), max_num_batched_tokens=2048
)
PAGE_COUNTS = (1, 4, 16, 64, 256)


def time_runner(model: str, k: int, steps: list, repeats: int) -> tuple[list[float], float]:
    """Median seconds per step and the draft's acceptance rate, from the real runner."""
    spec = {"model": model, "speculative_tokens": k, "steps": steps, "repeats": repeats}
    proc = subprocess.run(
        [sys.executable, "-m", "relaykv.model.step_timing"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"timing the runner failed:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return [float(x) for x in out["seconds"]], float(out["acceptance_rate"])


def time_transport(
    name: str, model: ModelSpec, k: int, repeats: int
) -> tuple[list[int], list[float]]:
    """Median seconds of reads of PAGE_COUNTS pages (group 0) between two real endpoints."""
    from relaykv.transfer.transport import PageCopy, PageLayout, get_transport

    geometry = model.geometry(with_draft=k > 0)
    blocks = max(PAGE_COUNTS) * 2 + 2
    layout = PageLayout.from_geometry(geometry, blocks)
    transport = get_transport(name)
    src = np.random.default_rng(0).integers(0, 255, (blocks, layout.block_bytes), dtype=np.uint8)
    dst = np.zeros_like(src)
    server = transport.create_server(src, layout, engine_id="calibrate-P")
    client = transport.create_client(dst, layout, engine_id="calibrate-D")
    sizes, seconds = [], []
    try:
        for i, n in enumerate(PAGE_COUNTS):
            pages = [PageCopy(0, 1 + j, 1 + n + j, layout.page_bytes[0]) for j in range(n)]
            runs = []
            for r in range(repeats):
                rid = f"cal-{i}-{r}"
                server.allow(rid, {0: [p.src for p in pages]}, time.monotonic() + 60)
                t0 = time.perf_counter()
                client.read(server.descriptor, rid, pages)
                runs.append(time.perf_counter() - t0)
                server.release(rid)
            sizes.append(sum(p.nbytes for p in pages))
            seconds.append(float(np.median(runs)))
    finally:
        client.close()
        server.close()
    return sizes, seconds


def calibrate(model_name: str, k: int, transport: str, quick: bool = False) -> dict:
    """Measure, fit, and return the calibration file's content."""
    model = model_spec(model_name)
    steps = calibration_steps(k, quick)
    print(
        f"[sim calibrate] timing {len(steps)} steps of {model_name} (k={k}) on the real runner",
        file=sys.stderr,
        flush=True,
    )
    seconds, acceptance = time_runner(model_name, k, steps, repeats=1 if quick else 3)
    hw = fit_hardware(f"calibrated:{model_name}", model, steps, seconds, k, CPU_BASE)
    errors = relative_errors(model, hw, steps, seconds, k)
    print(f"[sim calibrate] timing {transport} reads", file=sys.stderr, flush=True)
    sizes, link_s = time_transport(transport, model, k, repeats=2 if quick else 5)
    link = fit_link(transport, sizes, link_s)
    print("[sim calibrate] timing a served workload on a real cluster", file=sys.stderr, flush=True)
    served = measure_serving(model_name, k)
    hw, link = fit_serving(model, k, hw, link, served)
    out = asdict(hw)
    out["link"] = asdict(link)
    out["acceptance_rate"] = acceptance
    out["measured"] = {
        "model": model_name,
        "speculative_tokens": k,
        "steps": steps,
        "seconds": seconds,
        "fit_relative_error": errors,
        "transfer_bytes": sizes,
        "transfer_seconds": link_s,
        "serving_mean_ttft_ms": served["mean_ttft_ms"],
        "serving_mean_tpot_ms": served["mean_tpot_ms"],
        "serving_engine_means": served["engine_means"],
    }
    return out


def run_calibration(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        model_spec(args.model)
    except ValueError as exc:
        parser.error(str(exc))
    out = calibrate(args.model, args.speculative_tokens, args.kv_transport, args.calibrate_quick)
    Path(args.out).write_text(json.dumps(out, indent=1))
    errors = out["measured"]["fit_relative_error"]
    print(
        f"step overhead {1e3 * out['step_overhead_s']:.2f} ms, per sequence "
        f"{1e3 * out['per_sequence_overhead_s']:.2f} ms, per token "
        f"{1e6 * out['per_token_overhead_s']:.1f} us, "
        f"hop {1e3 * out['request_overhead_s']:.1f} ms, "
        f"{out['peak_flops'] / 1e9:.1f} GFLOP/s, "
        f"KV {out['kv_bandwidth'] / 1e9:.2f} GB/s, draft pass "
        f"{1e3 * out['draft_pass_overhead_s']:.2f} ms; link "
        f"{out['link']['bandwidth'] / 1e9:.2f} GB/s + {1e3 * out['link']['latency_s']:.2f} ms; "
        f"fit error median {100 * float(np.median(np.abs(errors))):.1f}%, "
        f"max {100 * float(np.max(np.abs(errors))):.1f}%; draft acceptance "
        f"{out['acceptance_rate']:.2f}"
    )
    print(f"wrote {args.out}")
    return 0
