"""Predicted vs measured on this machine: calibrate, then run the same small workload on a
real `relaykv up` cluster (tiny-hybrid + EAGLE draft, shm) and in the simulator.

Acceptance (docs/simulator.md "Validation against real runs"): mean TTFT, mean TPOT and
output throughput within 35 %, D's local hit tokens within 5 %. The calibration is made
here, on the machine that runs the test (a calibration file describes one machine), and
is not fitted on this workload. Timing on a machine shared with other jobs is noisy: when
a first calibration and comparison are out of tolerance, two more pairs run and each
metric's median error over the three is what is checked (a wrong cost model is off in
every run, noise is not).
The same comparison at bigger sizes is `benchmarks/sim_validate.py`.
"""

from __future__ import annotations

import json
import statistics

import pytest

# Exclusive: the measured run must not share the CPUs with another test (tests/exclusive.py).
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

TIMING = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")
TOLERANCE = {**dict.fromkeys(TIMING, 0.35), "d_local_hit_tokens": 0.05}


def _out_of_tolerance(errors: dict[str, float]) -> list[str]:
    return [key for key, tol in TOLERANCE.items() if abs(errors[key]) > tol]


def test_simulator_predicts_a_real_run(tmp_path) -> None:
    pytest.importorskip("torch")
    from benchmarks.sim_validate import QUICK, compare

    from relaykv.sim.calibrate_cli import calibrate

    (workload,) = QUICK.values()
    runs = []
    for attempt in range(3):
        # Each attempt calibrates afresh: a calibration slowed by a burst of other work would
        # otherwise skew all three comparisons the same way, like a wrong cost model.
        hardware = tmp_path / f"calibration{attempt}.json"
        hardware.write_text(json.dumps(calibrate("tiny-hybrid", 2, "shm", quick=True)))
        rows = compare(workload, str(hardware), tmp_path / f"run{attempt}")["rows"]
        runs.append({key: row["error"] for key, row in rows.items()})
        if attempt == 0 and not _out_of_tolerance(runs[0]):
            break
    median = {key: statistics.median(r[key] for r in runs) for key in TOLERANCE}
    assert not _out_of_tolerance(median), (median, runs)
