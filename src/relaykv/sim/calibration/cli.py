"""`relaykv sim calibrate --model M --out FILE`: measure this machine, fit, write the file.

1. The real model runner times `fit.calibration_steps` (prefills at several lengths
   and cached fractions, decode batches of 1-8 at several contexts, a mixed step) in a
   subprocess (`python -m relaykv.model.step_timing`: only the model layer loads models),
   with the draft `relaykv serve --speculative-tokens K` loads (the model's shipped one, or
   `--draft-model random`) and the torch threads of `--torch-threads` (default: torch's,
   as `relaykv up`'s engines).
2. The chosen transport (`--kv-transport`, default shm) times reads of 1 to 256 pages of
   the model's geometry between two real endpoints in this process.
3. `serving` serves the calibration workload on a real local cluster; `in_cluster` fits
   what the runner costs there from the engines' step logs, and `serving` the overheads
   its histograms show on top (per-token, per-step, per-hop and per-transfer seconds).
4. `fit.fit_hardware` / `fit_link` fit the cost model (before step 3's fits); the file
   holds the fitted `HardwareSpec` fields, a `link`, the measurements, the fit's relative
   errors and the `conditions` it was measured under (model, k, draft, torch threads,
   transport). Use it as `relaykv sim --hardware FILE` (its link is the default `--link`),
   which refuses other conditions (`hardware.check_conditions`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from relaykv.sim.calibration.fit import calibration_steps, fit_hardware, fit_link, relative_errors
from relaykv.sim.calibration.in_cluster import fit_in_cluster
from relaykv.sim.calibration.serving import fit_serving, measure_serving
from relaykv.sim.hardware import CalibrationConditions, HardwareSpec
from relaykv.sim.model_presets import model_spec
from relaykv.sim.models import ModelSpec

# relaykv serve's defaults on a CPU host: 1 GiB of KV pages, 2,048 tokens per step.
CPU_BASE = HardwareSpec(
    "cpu", 1.0, 1.0, float(1 << 30), kv_cache_memory=float(1 << 30), max_num_batched_tokens=2048
)
PAGE_COUNTS = (1, 4, 16, 64, 256)


def time_runner(
    model: str,
    k: int,
    steps: list,
    repeats: int,
    torch_threads: int | None = None,
    draft: str = "shipped",
) -> dict[str, Any]:
    """The real runner's fastest seconds per step (`seconds`), the draft's acceptance rate
    (`acceptance_rate`), and the torch threads and draft it ran with (`threads`, `draft`:
    None without a draft). `torch_threads` None: torch's default, as `relaykv up`'s engines."""
    spec = {
        "model": model,
        "speculative_tokens": k,
        "steps": steps,
        "repeats": repeats,
        "threads": torch_threads,
        "draft": draft,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "relaykv.model.step_timing"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"timing the runner failed:\n{proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


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


def calibrate(
    model_name: str,
    k: int,
    transport: str,
    quick: bool = False,
    torch_threads: int | None = None,
    draft: str = "shipped",
) -> dict:
    """Measure, fit, and return the calibration file's content. The runner and the served
    cluster run with the same k, draft (`shipped`: the model's own, `random`) and torch
    threads (None: torch's default, as `relaykv up`'s engines); the file's `conditions`
    record them, and `relaykv sim` refuses to simulate other ones (`check_conditions`)."""
    model = model_spec(model_name)
    steps = calibration_steps(k, quick)
    print(
        f"[sim calibrate] timing {len(steps)} steps of {model_name} (k={k}, draft "
        f"{draft if k else 'none'}) on the real runner",
        file=sys.stderr,
        flush=True,
    )
    runner = time_runner(model_name, k, steps, 1 if quick else 3, torch_threads, draft)
    seconds = [float(x) for x in runner["seconds"]]
    acceptance = float(runner["acceptance_rate"])
    threads = int(runner["threads"])
    hw = fit_hardware(f"calibrated:{model_name}", model, steps, seconds, k, CPU_BASE)
    errors = relative_errors(model, hw, steps, seconds, k)
    print(f"[sim calibrate] timing {transport} reads", file=sys.stderr, flush=True)
    sizes, link_s = time_transport(transport, model, k, repeats=2 if quick else 5)
    link = fit_link(transport, sizes, link_s)
    print("[sim calibrate] timing a served workload on a real cluster", file=sys.stderr, flush=True)
    served = measure_serving(
        model_name, k, torch_threads=threads, draft=draft, kv_transport=transport
    )
    hw, in_cluster = fit_in_cluster(model, k, hw, served["step_phases"])
    hw, link = fit_serving(model, k, hw, link, served)
    out = asdict(hw)
    out["link"] = asdict(link)
    out["acceptance_rate"] = acceptance
    out["conditions"] = CalibrationConditions(
        model_name, k, runner["draft"], threads, transport
    ).to_json()
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
        "in_cluster": in_cluster,
    }
    return out


def run_calibration(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        model_spec(args.model)
    except ValueError as exc:
        parser.error(str(exc))
    if args.speculative_tokens < 0:
        parser.error("argument --speculative-tokens: must be >= 0")
    try:
        out = calibrate(
            args.model,
            args.speculative_tokens,
            args.kv_transport,
            args.calibrate_quick,
            args.torch_threads,
            args.draft_model,
        )
    except RuntimeError as exc:
        if "NoDefaultDraft" in str(exc):
            parser.error(
                f"argument --draft-model: {args.model} ships no draft: calibrate with "
                "--draft-model random (and simulate with it)"
            )
        raise
    Path(args.out).write_text(json.dumps(out, indent=1))
    errors = out["measured"]["fit_relative_error"]
    print(
        f"step overhead {1e3 * out['step_overhead_s']:.2f} ms, per sequence "
        f"{1e3 * out['per_sequence_overhead_s']:.2f} ms, per token "
        f"{1e6 * out['per_token_overhead_s']:.1f} us, "
        f"hop {1e3 * out['request_overhead_s']:.1f} ms, "
        f"shared host x{out['shared_host_slowdown']:.2f}, "
        f"{out['peak_flops'] / 1e9:.1f} GFLOP/s, "
        f"KV {out['kv_bandwidth'] / 1e9:.2f} GB/s, draft pass "
        f"{1e3 * out['draft_pass_overhead_s']:.2f} ms; link "
        f"{out['link']['bandwidth'] / 1e9:.2f} GB/s + {1e3 * out['link']['latency_s']:.2f} ms; "
        f"fit error median {100 * float(np.median(np.abs(errors))):.1f}%, "
        f"max {100 * float(np.max(np.abs(errors))):.1f}%; draft acceptance "
        f"{out['acceptance_rate']:.2f}"
    )
    c = out["conditions"]
    print(
        f"wrote {args.out}: measured at --speculative-tokens {c['speculative_tokens']} "
        f"(draft {c['draft'] or 'none'}), --torch-threads {c['torch_threads']}, "
        f"--kv-transport {c['kv_transport']}; `relaykv sim --hardware {args.out}` simulates "
        'only these (docs/simulator.md, "Validation conditions")'
    )
    return 0
