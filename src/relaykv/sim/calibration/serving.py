"""The serving overheads a runner-only fit cannot see (docs/simulator.md "Calibration").

A served token costs more than the runner's step: the engine's bookkeeping around each
step (scheduling, hashing, commits, streaming on the engine's event loop) and the HTTP
hops through the router. `relaykv sim calibrate` measures them on a real local cluster
(`relaykv up`, with the runner's k, draft, torch threads and the timed transport) with
`relaykv bench serve` on its own workload
(random prompts at concurrency 1, greedy, after a warmup request: not the validation
workloads), and
reads the engines' own latency histograms before and after, so that each overhead is
measured where it arises instead of being inferred from the client's totals:

* `per_token_overhead_s`: P's mean `request_prefill_time` (first scheduled to first
  token, all prompts computed) minus the runner-fitted prefill of the same prompt, per
  computed token (the engine's per-token work: hashing, block tables, page writes);
* `step_overhead_s` (added): D's mean inter-token latency (one decode step per streamed
  chunk at concurrency 1) minus the runner-fitted decode step at the workload's mean
  context;
* the link's `latency_s`: D's mean `kv_transfer_seconds` (a load from its start to the
  step that sees it settled) minus the bytes at the timed transport's bandwidth, when
  that is more than the timed transport's own latency (the engines' IO threads and
  polling add to a bare read);
* `request_overhead_s` (one hop): the client's mean TTFT minus P's end-to-end latency and
  D's TTFT, halved (the router's two hops: client -> P, P's answer -> D).

Each is read on top of what the runner costs inside the served cluster, which
`in_cluster` fits first from both engines' step logs of this workload and of a second
and a third phase at concurrency 4 (`OVERLAP_WORKLOAD`, `BATCH_WORKLOAD`), also served
here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from relaykv.common.plumbing.child_process import ChildProcess
from relaykv.sim.calibration.in_cluster import StepPhase, mean_decode_context
from relaykv.sim.cost_model import SeqShape, step_cost
from relaykv.sim.hardware import HardwareSpec, LinkSpec
from relaykv.sim.models import ModelSpec

PROMPT_LEN, OUTPUT_LEN = 768, 48
WORKLOAD = [
    "--dataset-name",
    "random",
    "--random-input-len",
    str(PROMPT_LEN),
    "--random-output-len",
    str(OUTPUT_LEN),
    "--num-prompts",
    "8",
    "--max-concurrency",
    "1",
    "--seed",
    "7",
]
# Two more phases at concurrency 4 for `in_cluster` (what the runner costs in the served
# cluster): prompts of the same sizes, so that P prefills while D decodes (the shared host),
# and short prompts, so that D decodes batches of up to four streams while P is mostly idle.
OVERLAP_WORKLOAD = list(WORKLOAD)
OVERLAP_WORKLOAD[WORKLOAD.index("--max-concurrency") + 1] = "4"
OVERLAP_WORKLOAD[WORKLOAD.index("--num-prompts") + 1] = "12"
OVERLAP_WORKLOAD[WORKLOAD.index("--seed") + 1] = "9"
BATCH_PROMPT_LEN = 128
BATCH_WORKLOAD = list(OVERLAP_WORKLOAD)
BATCH_WORKLOAD[WORKLOAD.index("--random-input-len") + 1] = str(BATCH_PROMPT_LEN)
BATCH_WORKLOAD[WORKLOAD.index("--seed") + 1] = "10"
ENGINE = ["--num-blocks", "2000", "--max-model-len", "2048"]
# Engine histograms (Prometheus `<name>_sum` / `<name>_count`) the fit reads.
HISTOGRAMS = {
    "prefill": ("vllm:request_prefill_time_seconds", "vllm:e2e_request_latency_seconds"),
    "decode": (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "relaykv:kv_transfer_seconds",
        "relaykv:kv_bytes_received",  # a counter (`_total`): its per-load mean is taken below
    ),
}


def histogram_totals(metrics_text: str, names: tuple[str, ...]) -> dict[str, float]:
    """`{name_sum: total, name_count: total}` over every label set in a /metrics page."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        key = line.split("{", 1)[0].split(" ", 1)[0]
        for name in names:
            if key in (f"{name}_sum", f"{name}_count", f"{name}_total"):
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _scrape(url: str, names: tuple[str, ...]) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        return histogram_totals(response.read().decode(), names)


def histogram_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean of each histogram over the observations between two scrapes."""
    means = {}
    loads = after.get("relaykv:kv_transfer_seconds_count", 0.0)
    loads -= before.get("relaykv:kv_transfer_seconds_count", 0.0)
    for key in after:
        if key.endswith("_total") and loads > 0:  # a counter: per KV load
            means[key[: -len("_total")]] = (after[key] - before.get(key, 0.0)) / loads
        if key.endswith("_sum"):
            name = key[: -len("_sum")]
            n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
            if n > 0:
                means[name] = (after[key] - before.get(key, 0.0)) / n
    return means


def measure_serving(
    model: str,
    k: int,
    *,
    torch_threads: int | None = 1,
    draft: str = "shipped",
    kv_transport: str = "shm",
) -> dict[str, Any]:
    """`bench serve`'s result of `WORKLOAD` on a real local P/D cluster, plus the engines'
    histogram means over the measured requests (`engine_means`: role -> name -> seconds)
    and both engines' logged steps of it, of `OVERLAP_WORKLOAD` and of `BATCH_WORKLOAD`
    after it (`step_phases`: one `StepPhase` each).
    The engines run with the runner's timing conditions: k draft tokens of `draft`
    (`shipped`: the model's own; `random`), `torch_threads` torch threads each (None:
    `relaykv up`'s default) and `kv_transport`."""
    env = dict(os.environ)
    up = [sys.executable, "-m", "relaykv", "up", "--json", "--model", model]
    up += ["--speculative-tokens", str(k), "--kv-transport", kv_transport, *ENGINE]
    if k and draft == "random":
        up += ["--draft-model", "random"]
    if torch_threads is not None:
        up += ["--torch-threads", str(torch_threads)]
    with tempfile.TemporaryDirectory() as tmp:
        # The members' logs go with the temporary directory (nothing reads them), instead of
        # one /tmp/relaykv-up-* directory left behind per calibration. SIGTERM goes to the
        # up command alone: it stops its own cluster.
        up_process = ChildProcess(
            [*up, "--log-dir", str(Path(tmp) / "up")], pipe=True, env=env, signal_group=False
        )
        up_process.start()
        try:
            cluster = up_process.wait_for_line(_cluster_line, None)
            if cluster is None:
                raise RuntimeError("relaykv up exited before printing its cluster JSON line")
            bench = [sys.executable, "-m", "relaykv", "bench", "serve"]
            bench += ["--base-url", cluster["router"], "--ignore-eos", "--disable-tqdm"]
            bench += ["--save-result", "--result-dir", tmp, "--result-filename", "serving.json"]
            # Greedy, like the simulator's tokens and the calibrated acceptance rate: the
            # server's default (temperature 1) accepts far fewer drafts.
            bench += ["--temperature", "0", *WORKLOAD]
            # One request of another prompt first (first-touch costs of both engines),
            # outside the scrapes.
            warm = [*bench[: -len(WORKLOAD)], *_warmup_only(WORKLOAD)]
            subprocess.run(warm, check=True, capture_output=True, text=True, env=env)
            since = {r: _steps(cluster[r][0], float("inf"))["now"] for r in HISTOGRAMS}
            before = {r: _scrape(cluster[r][0], HISTOGRAMS[r]) for r in HISTOGRAMS}
            subprocess.run(bench, check=True, capture_output=True, text=True, env=env)
            after = {r: _scrape(cluster[r][0], HISTOGRAMS[r]) for r in HISTOGRAMS}
            result = json.loads((Path(tmp) / "serving.json").read_text())
            phases = []
            for workload, prompt_len in (
                (None, PROMPT_LEN),
                (OVERLAP_WORKLOAD, PROMPT_LEN),
                (BATCH_WORKLOAD, BATCH_PROMPT_LEN),
            ):
                if workload is not None:
                    run = [*bench[: -len(WORKLOAD)], *workload]
                    subprocess.run(run, check=True, capture_output=True, text=True, env=env)
                logs = {r: _steps(cluster[r][0], since[r]) for r in HISTOGRAMS}
                since = {r: logs[r]["now"] for r in HISTOGRAMS}
                steps = {r: logs[r]["steps"] for r in HISTOGRAMS}
                phases.append(StepPhase(prompt_len, OUTPUT_LEN, steps))
        finally:
            up_process.stop(60)
    result["engine_means"] = {r: histogram_means(before[r], after[r]) for r in HISTOGRAMS}
    result["step_phases"] = phases
    return result


def _steps(url: str, since: float) -> dict[str, Any]:
    """The engine's step log from `since` on (`GET /steps`; `since` inf: only its clock)."""
    with urllib.request.urlopen(f"{url}/steps?since={since}", timeout=30) as response:
        return cast(dict[str, Any], json.loads(response.read()))


def _cluster_line(line: str) -> dict[str, Any] | None:
    """The cluster JSON line `relaykv up --json` prints once every member is ready."""
    if line.startswith("{") and '"router"' in line:
        return cast(dict[str, Any], json.loads(line))
    return None


def _warmup_only(workload: list[str]) -> list[str]:
    """`workload` with one prompt of another seed."""
    out = list(workload)
    out[out.index("--num-prompts") + 1] = "1"
    out[out.index("--seed") + 1] = "8"
    return out


def fit_serving(
    model: ModelSpec, k: int, hw: HardwareSpec, link: LinkSpec, measured: dict[str, Any]
) -> tuple[HardwareSpec, LinkSpec]:
    """`hw` with the per-token, per-step and per-hop overheads and `link` with the
    per-transfer latency that `measured` shows (the module docstring's decomposition;
    each overhead is clamped at 0)."""
    p, d = measured["engine_means"]["prefill"], measured["engine_means"]["decode"]
    chunk = hw.max_num_batched_tokens
    prefill = [SeqShape(s, min(chunk, PROMPT_LEN - s)) for s in range(0, PROMPT_LEN, chunk)]
    runner_prefill = sum(step_cost(model, hw, 1, [c]).seconds for c in prefill)
    per_token = max(0.0, (p["vllm:request_prefill_time_seconds"] - runner_prefill) / PROMPT_LEN)
    mean_context = mean_decode_context(PROMPT_LEN, OUTPUT_LEN)
    decode = SeqShape(mean_context, 1 + k, k)
    runner_decode = step_cost(model, hw, 1, [decode]).seconds
    extra_step = max(0.0, d["vllm:inter_token_latency_seconds"] - runner_decode)
    engines = p["vllm:e2e_request_latency_seconds"] + d["vllm:time_to_first_token_seconds"]
    hop = max(0.0, (measured["mean_ttft_ms"] / 1000 - engines) / 2)
    latency = link.latency_s
    if d.get("relaykv:kv_transfer_seconds"):
        served = d["relaykv:kv_transfer_seconds"] - d["relaykv:kv_bytes_received"] / link.bandwidth
        latency = max(latency, served)
    hw = replace(
        hw,
        step_overhead_s=hw.step_overhead_s + extra_step,
        per_token_overhead_s=per_token,
        request_overhead_s=hop,
    )
    return hw, replace(link, latency_s=latency)
