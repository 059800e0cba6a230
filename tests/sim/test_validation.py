"""Predicted vs measured on this machine: calibrate, then run the same small workload on a
real `relaykv up` cluster (tiny-hybrid, shm) and in the simulator, at `relaykv up`'s
defaults (no draft, the default torch threads) and with the shipped EAGLE draft at k=2.

Acceptance (docs/simulator.md "Validation against real runs"): mean TTFT, mean TPOT and
output throughput within 35 %, the prompt tokens D did not compute (its local hits plus the
KV it received) within 5 %. Which of the two a sibling's prefix counts as is a race (its
group's load still in flight on D, shared, or already settled, reused), which the
simulator's times decide only within their own tolerance; what D computed is not. The
calibration is made here, on the machine that runs the test (a calibration file describes
one machine), and is not fitted on this workload. Timing on a machine shared with other jobs
is noisy: when a first calibration and comparison are out of tolerance, two more pairs run
and each metric's median error over the three is what is checked (a wrong cost model is off
in every run, noise is not).
The same comparison at bigger sizes is `benchmarks/sim_validate.py`.
"""

from __future__ import annotations

import json
import os
import statistics

import pytest

# Exclusive: the measured run must not share the CPUs with another test (tests/exclusive.py).
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

TIMING = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")
REUSED = "d_reused_tokens"  # D's local hit tokens + the tokens it received
TOLERANCE = {**dict.fromkeys(TIMING, 0.35), REUSED: 0.05}
# Six rounds of the workload (other prompts each) on one real cluster, pooled: a single
# round lasts about two seconds, at the mercy of the machine's speed in those seconds and of
# races the simulator does not have (two of a burst's first prompts reaching P before its
# first step starts: P then prefills both in full; 1 round in 8 here, 1.3-1.7x the TTFT).
SEEDS = tuple(range(6))


def _errors(result: dict) -> dict[str, float]:
    errors = {key: result["rows"][key]["error"] for key in TIMING}
    real, sim = (
        result[side]["d_local_hit_tokens"] + result[side]["d_external_hit_tokens"]
        for side in ("real", "sim")
    )
    errors[REUSED] = sim / real - 1 if real else float(sim != 0)
    return errors


def threads() -> int:
    import torch

    return torch.get_num_threads()


def _out_of_tolerance(errors: dict[str, float]) -> list[str]:
    return [key for key, tol in TOLERANCE.items() if abs(errors[key]) > tol]


@pytest.mark.parametrize(
    "k",
    [
        pytest.param(0, id="up-defaults"),  # relaykv up's defaults: no draft
        pytest.param(2, id="shipped-draft-k2"),  # the draft tiny-hybrid ships, k=2
    ],
)
def test_simulator_predicts_a_real_run(tmp_path, k: int) -> None:
    """Calibration, real run and simulation at the same conditions: k (with the shipped
    draft), `relaykv up`'s default torch threads (here the suite's `OMP_NUM_THREADS`), the
    default shm transport."""
    pytest.importorskip("torch")
    from benchmarks.sim_validate import QUICK, compare

    from relaykv.sim.calibration.cli import calibrate

    (workload,) = QUICK.values()
    runs = []
    for attempt in range(3):
        # Each attempt calibrates afresh: a calibration slowed by a burst of other work would
        # otherwise skew all three comparisons the same way, like a wrong cost model.
        hardware = tmp_path / f"calibration{attempt}.json"
        calibration = calibrate("tiny-hybrid", k, "shm", quick=True)
        assert calibration["conditions"] == {
            "model": "tiny-hybrid",
            "speculative_tokens": k,
            "draft": "shipped" if k else None,  # timed with the draft the model ships
            "torch_threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or threads(),
            "kv_transport": "shm",
        }
        assert (calibration["acceptance_rate"] > 0) == (k > 0)
        hardware.write_text(json.dumps(calibration))
        result = compare(workload, str(hardware), tmp_path / f"run{attempt}", k=k, seeds=SEEDS)
        runs.append(_errors(result))
        in_cluster = calibration["measured"]["in_cluster"]
        print(f"k={k} attempt {attempt}: errors {runs[-1]}; calibration in cluster {in_cluster}")
        if attempt == 0 and not _out_of_tolerance(runs[0]):
            break
    median = {key: statistics.median(r[key] for r in runs) for key in TOLERANCE}
    assert not _out_of_tolerance(median), (median, runs)
