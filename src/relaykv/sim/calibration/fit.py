"""Fitting the cost model to measured step times and transfers (docs/simulator.md
"Calibration").

A measured machine is described like a preset, with `combine = sum` (a CPU does not
overlap compute and memory traffic the way a GPU's roofline assumes):

    seconds = step_overhead + per_sequence_overhead * sequences + FLOPs / F + KV bytes / K
              + passes * (draft_pass_overhead + pass FLOPs / F + pass KV bytes / K)

which is linear in (1, sequences, total FLOPs, KV bytes, passes). A dense model reads the
same weight bytes every step (and every draft pass), so on one machine they cannot be told
apart from the fixed overheads: the fit folds them in (`hbm_bandwidth` is left infinite),
which is exact for the calibrated model and is why a calibration file is per model. The
terms are `cost_model.step_terms`'. The coefficients come from non-negative least squares (an
active-set loop over `numpy.linalg.lstsq`), relative to each step's time so that short
decode steps weigh as much as long prefills. The link is `latency + bytes / bandwidth`
fitted the same way on timed reads of different sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from relaykv.sim.cost_model import SeqShape, step_terms
from relaykv.sim.hardware import HardwareSpec, LinkSpec
from relaykv.sim.models import ModelSpec

# Step shapes timed by `relaykv sim calibrate`: [start, new, drafts, propose] per sequence.
PREFILLS = [
    (0, 32),
    (0, 128),
    (0, 512),
    (0, 1024),
    (0, 2048),
    (1024, 512),
    (2048, 1024),
    (3072, 256),
    (4096, 64),
]
DECODES = [(b, ctx) for b in (1, 2, 4, 8) for ctx in (128, 1024, 3072)]


QUICK_PREFILLS = [(0, 64), (0, 512), (512, 256), (1024, 32)]
QUICK_DECODES = [(1, 256), (4, 256), (2, 1024)]


def calibration_steps(k: int, quick: bool = False) -> list[list[list[int]]]:
    """The step shapes to time; `quick`: a smaller set (tests)."""
    prefills, decodes = (QUICK_PREFILLS, QUICK_DECODES) if quick else (PREFILLS, DECODES)
    # Prefills as a prefill engine runs them (no proposals), a few as a colocated engine's
    # last chunk (proposing), decode steps verifying k drafts, and a mixed step.
    steps = [[[start, new, 0, 0]] for start, new in prefills]
    steps += [[[start, new, 0, 1]] for start, new in prefills[1:4]]
    steps += [[[ctx, 1, k, 1] for _ in range(b)] for b, ctx in decodes]
    steps.append([[0, 512, 0, 0], [1024, 1, k, 1], [2048, 1, k, 1]])
    return steps


def _shapes(step: Sequence[Sequence[int]], k: int) -> list[SeqShape]:
    return [
        SeqShape(start, new + drafts, k if propose else 0) for start, new, drafts, propose in step
    ]


def features(model: ModelSpec, step: Sequence[Sequence[int]], k: int) -> list[float]:
    t = step_terms(model, _shapes(step, k))
    kv = t.kv_bytes + t.passes * t.pass_kv_bytes
    return [1.0, float(t.num_seqs), t.flops + t.passes * t.pass_flops, kv, float(t.passes)]


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b| with x >= 0 (drop the most negative coefficient until none is left)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def fit_hardware(
    name: str,
    model: ModelSpec,
    steps: list[list[list[int]]],
    seconds: list[float],
    k: int,
    base: HardwareSpec,
) -> HardwareSpec:
    a = np.array([features(model, s, k) for s in steps])
    y = np.array(seconds)
    w = 1.0 / y  # relative error
    c = nnls(a * w[:, None], y * w)
    tiny = 1e-30
    return replace(
        base,
        name=name,
        combine="sum",
        mfu=1.0,
        mbu=1.0,
        step_overhead_s=float(c[0]),
        per_sequence_overhead_s=float(c[1]),
        peak_flops=1.0 / max(float(c[2]), tiny),
        hbm_bandwidth=1.0 / tiny,  # weights: folded into the overheads (see above)
        kv_bandwidth=1.0 / max(float(c[3]), tiny),
        draft_pass_overhead_s=float(c[4]),
    )


def fit_link(name: str, sizes: list[int], seconds: list[float]) -> LinkSpec:
    a = np.array([[1.0, float(n)] for n in sizes])
    c = nnls(a, np.array(seconds))
    return LinkSpec(name, 1.0 / max(float(c[1]), 1e-30), float(c[0]))


def relative_errors(
    model: ModelSpec, hw: HardwareSpec, steps: list[list[list[int]]], seconds: list[float], k: int
) -> list[float]:
    from relaykv.sim.cost_model import step_cost

    return [
        step_cost(model, hw, 1, _shapes(s, k)).seconds / t - 1
        for s, t in zip(steps, seconds, strict=True)
    ]
