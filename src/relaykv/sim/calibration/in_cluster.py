"""What the runner costs inside the served cluster, read from the engines' step logs
(docs/simulator.md "Calibration", step 3).

The runner is timed alone (`relaykv/model/step_timing.py`: one process, back-to-back steps
of uniform batches). Served, the same steps take longer, and not by a constant: on the
2-core development host a 768-token prefill took about 1.2x its runner-fitted time, and
every further sequence of a decode batch 2-5 ms more than the runner's (the engine's HTTP
thread streams each sequence's tokens while the step runs, in the same interpreter and on
the same cores; a batch of mixed context lengths also costs more than a uniform one). And
under concurrency P's prefills and D's decode steps run at the same time on the same cores,
memory bandwidth and caches, so both take longer again. The serving overheads read at
concurrency 1 (`serving`) see neither: a served batch of one, and P and D never
computing at once. Without this fit the validation runs at concurrency 4
(docs/simulator.md "Validation against real runs") came out 25-50% slower than predicted.

So `relaykv sim calibrate` serves two more phases at concurrency 4 (`serving`) and reads
both engines' recent steps (`GET /steps`: start, end and batch of every executed step, on
the host's monotonic clock) over all three phases. For each step: its measured time `d`,
its runner-fitted time `r`, its number of sequences `n`, and the fraction `x` of it during
which the other engine ran a step (within its phase). Then

* the steps that ran alone (`x < ALONE`) fit `d = a r + s n + b`: `a` from P's prefills
  (the median of `(d - s - b) / r`), `s` and `b` from D's decode batches (non-negative
  least squares over the medians of each batch size); `a` scales the runner's compute,
  memory and overhead terms, `s` adds to the per-sequence overhead and `b` to the
  per-step one;
* the steps that overlapped the other engine's (`x >= OVERLAPPED`) give the shared host's
  slowdown `f` (`shared_host_slowdown`): their median time over the fit above's, which
  the simulator applies by processor sharing (`relaykv.sim.shared_host`); 1 when too few
  steps overlapped to tell.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from relaykv.sim.calibration.fit import nnls
from relaykv.sim.cost_model import SeqShape, step_cost
from relaykv.sim.hardware import HardwareSpec
from relaykv.sim.models import ModelSpec

# A step ran alone when the other engine ran during less than this fraction of it; the fit
# needs MIN_STEPS such steps of each role, and MIN_STEPS steps' worth of overlap for `f`.
ALONE = 0.25
OVERLAPPED = 0.75
MIN_STEPS = 3
ROUNDS = 8


def mean_decode_context(prompt_len: int, output_len: int) -> int:
    """Where a decode step of the calibration workload is priced: halfway through its output
    (the step logs and the histograms carry no positions)."""
    return prompt_len + output_len // 2


def step_shapes(
    role: str,
    work: Sequence[dict[str, Any]],
    k: int,
    positions: dict[str, int],
    prompt_len: int,
    output_len: int,
) -> list[SeqShape]:
    """The cost model's shapes of one logged step of the calibration workload (random
    `prompt_len`-token prompts, no prefix hits, `output_len` output tokens). The log has
    no positions: a prefill continues where the request's last chunk ended (`positions`),
    a load recomputes the last prompt position, and a decode step is placed at the
    workload's mean context (`mean_decode_context`, as `serving.fit_serving` does). A
    decode engine's steps propose k drafts; a prefill engine hands over without proposing."""
    shapes = []
    for w in work:
        n = int(w["tokens"]) + int(w["draft_tokens"])
        if w["kind"] == "prefill":
            start = positions.get(w["request_id"], 0)
            positions[w["request_id"]] = start + n
        elif w["kind"] == "load":
            start = prompt_len - 1
        else:
            start = mean_decode_context(prompt_len, output_len)
        shapes.append(SeqShape(start, n, k if role != "prefill" and k else 0))
    return shapes


def overlap_fractions(
    steps: Sequence[dict[str, Any]], others: Sequence[dict[str, Any]]
) -> list[float]:
    """For each step, the fraction of its time during which a step of `others` ran (each
    engine runs one step at a time, so `others`' intervals do not overlap each other)."""
    spans = sorted((float(o["start"]), float(o["end"])) for o in others)
    ends = [e for _, e in spans]
    out = []
    for step in steps:
        start, end = float(step["start"]), float(step["end"])
        covered = 0.0
        i = bisect_left(ends, start)  # the first other step that ends after this one starts
        while i < len(spans) and spans[i][0] < end:
            covered += max(0.0, min(end, spans[i][1]) - max(start, spans[i][0]))
            i += 1
        out.append(covered / (end - start) if end > start else 0.0)
    return out


@dataclass(frozen=True, slots=True)
class StepPhase:
    """Both engines' logged steps (`GET /steps` records by role) of one phase of the
    calibration workload: random `prompt_len`-token prompts, `output_len` output tokens."""

    prompt_len: int
    output_len: int
    steps: dict[str, list[dict[str, Any]]]


def fit_in_cluster(
    model: ModelSpec, k: int, hw: HardwareSpec, phases: Sequence[StepPhase]
) -> tuple[HardwareSpec, dict[str, Any]]:
    """`hw` (runner-fitted) as the served engines run it, with `shared_host_slowdown`, from
    the `prefill` and `decode` engines' logged steps of the calibration workload's phases
    (the module docstring's fit), and what was measured. `hw` unchanged when fewer than
    `MIN_STEPS` prefills or no batch size of decode steps ran alone that often."""
    rows = []  # (role, sequences, runner-fitted seconds, measured seconds, overlapped fraction)
    for phase in phases:
        for role, other in (("prefill", "decode"), ("decode", "prefill")):
            steps = phase.steps.get(role, [])
            positions: dict[str, int] = {}
            overlaps = overlap_fractions(steps, phase.steps.get(other, []))
            for step, x in zip(steps, overlaps, strict=True):
                shapes = step_shapes(
                    role, step["work"], k, positions, phase.prompt_len, phase.output_len
                )
                fitted = step_cost(model, hw, 1, shapes).seconds
                measured = float(step["end"]) - float(step["start"])
                rows.append((role, len(shapes), fitted, measured, x))
    # `a` from P's prefills alone (their runner time dwarfs the per-step costs), `s` and `b`
    # from D's decode batches alone, in groups of one batch size, each group its medians (a
    # step that met a page fault or a garbage collection does not pull the fit); the two
    # depend on each other a little (a prefill step pays `s + b` too): a few rounds settle.
    prefill = [(f, m) for role, _, f, m, x in rows if role == "prefill" and x < ALONE]
    groups: dict[int, list[tuple[float, float]]] = {}
    for role, n, f, m, x in rows:
        if role == "decode" and x < ALONE:
            groups.setdefault(n, []).append((f, m))
    medians = {
        n: (float(np.median([f for f, _ in v])), float(np.median([m for _, m in v])))
        for n, v in groups.items()
        if len(v) >= MIN_STEPS
    }
    detail: dict[str, Any] = {
        "steps": len(rows),
        "alone_prefill_steps": len(prefill),
        "alone_decode_steps": {n: len(v) for n, v in sorted(groups.items())},
    }
    if len(prefill) < MIN_STEPS or not medians:
        detail["note"] = "too few steps ran alone: runner fit kept"
        return hw, detail
    sizes = sorted(medians)
    s = b = 0.0
    for _ in range(ROUNDS):
        a = float(np.median([(m - s - b) / f for f, m in prefill]))
        excess = np.array([medians[n][1] - a * medians[n][0] for n in sizes])
        if len(sizes) > 1:
            s, b = (float(c) for c in nnls(np.array([[float(n), 1.0] for n in sizes]), excess))
        else:  # one batch size: a per-step cost only
            s, b = 0.0, max(0.0, float(excess[0]))
    if a <= 0:
        detail["note"] = "no runner term in the served prefills: runner fit kept"
        return hw, detail
    # The overlapped steps' measured time over what the fit above gives them alone.
    ratios = [m / (a * f + s * n + b) for _, n, f, m, x in rows if x >= OVERLAPPED]
    slowdown = max(1.0, float(np.median(ratios))) if len(ratios) >= MIN_STEPS else 1.0
    detail.update(
        runner_scale=a,
        added_per_sequence_s=s,
        added_per_step_s=b,
        overlapped_steps=len(ratios),
        shared_host_slowdown=slowdown,
    )
    served = replace(
        hw,
        peak_flops=hw.peak_flops / a,
        kv_bandwidth=(hw.kv_bandwidth or hw.hbm_bandwidth) / a,
        step_overhead_s=hw.step_overhead_s * a + b,
        per_sequence_overhead_s=hw.per_sequence_overhead_s * a + s,
        draft_pass_overhead_s=hw.draft_pass_overhead_s * a,
        shared_host_slowdown=slowdown,
    )
    return served, detail
