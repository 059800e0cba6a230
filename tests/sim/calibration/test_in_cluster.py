"""What the runner costs in the served cluster: the fit recovers a known cluster from step
logs made with it (`relaykv.sim.calibration.in_cluster`)."""

from __future__ import annotations

import random

import pytest

from relaykv.sim.calibration.in_cluster import (
    StepPhase,
    fit_in_cluster,
    overlap_fractions,
    step_shapes,
)
from relaykv.sim.cost_model import SeqShape, step_cost
from relaykv.sim.model_presets import model_spec
from tests.sim.calibration.test_fit import TRUTH

RUNNER = TRUTH  # a runner-fitted machine
PROMPT, OUTPUT, K = 768, 48, 2
A, S, B, F = 1.2, 3e-3, 1e-3, 1.3  # the served cluster the logs are made with


def _prefill(rid: str) -> list[dict]:
    return [{"request_id": rid, "kind": "prefill", "tokens": PROMPT, "draft_tokens": 0}]


def _decode(n: int) -> list[dict]:
    return [
        {"request_id": f"d{i}", "kind": "decode", "tokens": 1, "draft_tokens": K} for i in range(n)
    ]


def _alone_time(role: str, work: list[dict]) -> float:
    shapes = step_shapes(role, work, K, {}, PROMPT, OUTPUT)
    return A * step_cost(model_spec("tiny-hybrid"), RUNNER, 1, shapes).seconds + S * len(work) + B


def _logs(noise: float) -> dict[str, list[dict]]:
    """Alone P prefills and D decode batches of 1-4, then P prefills each covered by D's
    decode steps, all F times slower; `noise`: each step's time off by up to that much."""
    rng = random.Random(0)
    jitter = lambda: 1 + rng.uniform(-noise, noise)  # noqa: E731
    logs: dict[str, list[dict]] = {"prefill": [], "decode": []}
    t = 0.0
    for i in range(5):
        work = _prefill(f"p{i}")
        d = _alone_time("prefill", work) * jitter()
        logs["prefill"].append({"start": t, "end": t + d, "work": work})
        t += d + 0.01
    for n in (1, 2, 3, 4):
        for _ in range(6):
            work = _decode(n)
            d = _alone_time("decode", work) * jitter()
            logs["decode"].append({"start": t, "end": t + d, "work": work})
            t += d + 0.001
    for i in range(4):
        work = _prefill(f"q{i}")
        end = t + _alone_time("prefill", work) * F * jitter()
        logs["prefill"].append({"start": t, "end": end, "work": work})
        while t < end:
            d = _alone_time("decode", _decode(2)) * F * jitter()
            logs["decode"].append({"start": t, "end": t + d, "work": _decode(2)})
            t += d
        t += 0.01
    return logs


def test_the_fit_recovers_a_known_cluster() -> None:
    model = model_spec("tiny-hybrid")
    served, detail = fit_in_cluster(model, K, RUNNER, [StepPhase(PROMPT, OUTPUT, _logs(0.0))])
    assert detail["runner_scale"] == pytest.approx(A, rel=1e-6)
    assert detail["added_per_sequence_s"] == pytest.approx(S, rel=1e-6)
    assert detail["added_per_step_s"] == pytest.approx(B, rel=1e-6)
    assert served.shared_host_slowdown == pytest.approx(F, rel=1e-6)
    # The served hardware prices a step alone as the cluster ran it.
    for n in (1, 3):
        shapes = [SeqShape(PROMPT + OUTPUT // 2, 1 + K, K)] * n
        want = _alone_time("decode", _decode(n))
        assert step_cost(model, served, 1, shapes).seconds == pytest.approx(want, rel=1e-6)
    # Noisy logs: within a few percent.
    _, noisy = fit_in_cluster(model, K, RUNNER, [StepPhase(PROMPT, OUTPUT, _logs(0.05))])
    assert noisy["runner_scale"] == pytest.approx(A, rel=0.1)
    assert noisy["shared_host_slowdown"] == pytest.approx(F, rel=0.05)


def test_too_few_alone_steps_keep_the_runner_fit() -> None:
    logs = _logs(0.0)
    logs["prefill"] = logs["prefill"][5:]  # only overlapped prefills
    phases = [StepPhase(PROMPT, OUTPUT, logs)]
    served, detail = fit_in_cluster(model_spec("tiny-hybrid"), K, RUNNER, phases)
    assert served == RUNNER and "too few" in detail["note"]


def test_overlap_fractions_and_positions() -> None:
    steps = [{"start": 0.0, "end": 1.0}, {"start": 2.0, "end": 4.0}, {"start": 5.0, "end": 5.0}]
    others = [{"start": 0.5, "end": 2.5}, {"start": 3.5, "end": 9.0}]
    assert overlap_fractions(steps, others) == pytest.approx([0.5, 0.5, 0.0])
    positions: dict[str, int] = {}
    chunk = [{"request_id": "r", "kind": "prefill", "tokens": 512, "draft_tokens": 0}]
    assert step_shapes("prefill", chunk, K, positions, PROMPT, OUTPUT) == [SeqShape(0, 512, 0)]
    assert step_shapes("prefill", chunk, K, positions, PROMPT, OUTPUT) == [SeqShape(512, 512, 0)]
    load = [{"request_id": "r", "kind": "load", "tokens": 1, "draft_tokens": 0}]
    assert step_shapes("decode", load, K, positions, PROMPT, OUTPUT) == [SeqShape(PROMPT - 1, 1, K)]
