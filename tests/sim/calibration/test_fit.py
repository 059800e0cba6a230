"""Calibration: the fit recovers a known machine; the real runner can be timed."""

from __future__ import annotations

import pytest

from relaykv.sim.calibration.fit import (
    calibration_steps,
    features,
    fit_hardware,
    fit_link,
    nnls,
    relative_errors,
)
from relaykv.sim.cost_model import SeqShape, step_cost
from relaykv.sim.hardware import HardwareSpec
from relaykv.sim.model_presets import model_spec

TRUTH = HardwareSpec(
    "truth",
    peak_flops=7e9,
    hbm_bandwidth=1e30,
    memory_bytes=1e9,
    mfu=1.0,
    mbu=1.0,
    step_overhead_s=4e-3,
    per_sequence_overhead_s=0.5e-3,
    draft_pass_overhead_s=1e-3,
    kv_bandwidth=0.5e9,
    combine="sum",
)


def test_fit_recovers_a_known_machine() -> None:
    model, k = model_spec("tiny-hybrid"), 2
    steps = calibration_steps(k)
    seconds = [
        step_cost(model, TRUTH, 1, [SeqShape(s, n + d, k * p) for s, n, d, p in step]).seconds
        for step in steps
    ]
    hw = fit_hardware("fit", model, steps, seconds, k, TRUTH)
    assert hw.peak_flops == pytest.approx(7e9, rel=1e-6)
    assert hw.step_overhead_s == pytest.approx(4e-3, rel=1e-6)
    assert hw.per_sequence_overhead_s == pytest.approx(0.5e-3, rel=1e-6)
    assert hw.draft_pass_overhead_s == pytest.approx(1e-3, rel=1e-6)
    assert hw.kv_bandwidth == pytest.approx(0.5e9, rel=1e-6)
    assert max(abs(e) for e in relative_errors(model, hw, steps, seconds, k)) < 1e-6
    assert len(features(model, steps[0], k)) == 5


def test_nnls_and_link_fit() -> None:
    import numpy as np

    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nnls(a, np.array([-1.0, 2.0, 1.0])).tolist() == pytest.approx([0.0, 1.5])
    link = fit_link(
        "t", [1000, 2000, 4000], [0.001 + 1000 / 1e6, 0.001 + 2000 / 1e6, 0.001 + 4000 / 1e6]
    )
    assert link.bandwidth == pytest.approx(1e6) and link.latency_s == pytest.approx(0.001)


@pytest.mark.slow
def test_the_real_runner_can_be_timed() -> None:
    pytest.importorskip("torch")
    from relaykv.model.step_timing import time_steps

    out = time_steps(
        {
            "model": "tiny-hybrid",
            "speculative_tokens": 0,
            "repeats": 1,
            "steps": [[[0, 32, 0, 0]], [[64, 1, 0, 1], [64, 1, 0, 1]]],
        }
    )
    assert len(out) == 2 and all(t > 0 for t in out)


def test_serving_overheads_are_read_where_they_arise() -> None:
    """`fit_serving`'s decomposition on hand-made engine histograms: P's extra prefill
    time per token, D's extra step time, the transfer latency and the two hops."""
    from relaykv.sim.calibration.serving import (
        OUTPUT_LEN,
        PROMPT_LEN,
        fit_serving,
        histogram_means,
        histogram_totals,
    )
    from relaykv.sim.hardware import LinkSpec

    text = "\n".join(
        [
            "# HELP vllm:inter_token_latency_seconds x",
            'vllm:inter_token_latency_seconds_sum{model_name="m"} 3.0',
            'vllm:inter_token_latency_seconds_count{model_name="m"} 10.0',
            "relaykv:kv_bytes_received_total 8000.0",
            "relaykv:kv_transfer_seconds_sum 0.5",
            "relaykv:kv_transfer_seconds_count 4.0",
        ]
    )
    names = (
        "vllm:inter_token_latency_seconds",
        "relaykv:kv_transfer_seconds",
        "relaykv:kv_bytes_received",
    )
    before = {"vllm:inter_token_latency_seconds_sum": 1.0}
    before["vllm:inter_token_latency_seconds_count"] = 5.0
    means = histogram_means(before, histogram_totals(text, names))
    assert means["vllm:inter_token_latency_seconds"] == pytest.approx(2.0 / 5)
    assert means["relaykv:kv_bytes_received"] == pytest.approx(2000.0)
    assert means["relaykv:kv_transfer_seconds"] == pytest.approx(0.125)

    model, k = model_spec("tiny-hybrid"), 2
    prefill = step_cost(model, TRUTH, 1, [SeqShape(0, PROMPT_LEN)]).seconds
    decode = step_cost(model, TRUTH, 1, [SeqShape(PROMPT_LEN + OUTPUT_LEN // 2, 1 + k, k)])
    link = LinkSpec("t", 1e6, 1e-3)
    measured = {
        "mean_ttft_ms": 1000 * (prefill + 0.5 + 0.02 + 0.01),
        "engine_means": {
            "prefill": {
                "vllm:request_prefill_time_seconds": prefill + 1e-5 * PROMPT_LEN,
                "vllm:e2e_request_latency_seconds": prefill + 0.5,
            },
            "decode": {
                "vllm:time_to_first_token_seconds": 0.02,
                "vllm:inter_token_latency_seconds": decode.seconds + 2e-3,
                "relaykv:kv_transfer_seconds": 0.006 + 2000 / 1e6,
                "relaykv:kv_bytes_received": 2000.0,
            },
        },
    }
    hw, fitted_link = fit_serving(model, k, TRUTH, link, measured)
    assert hw.per_token_overhead_s == pytest.approx(1e-5)
    assert hw.step_overhead_s == pytest.approx(TRUTH.step_overhead_s + 2e-3)
    assert hw.request_overhead_s == pytest.approx(0.005)
    assert fitted_link.latency_s == pytest.approx(0.006)
    assert fitted_link.bandwidth == link.bandwidth
