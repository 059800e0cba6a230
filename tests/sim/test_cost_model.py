"""The cost model's arithmetic on cases computed by hand (docs/simulator.md "Cost model")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from relaykv.sim.cost_model import SeqShape, context_len, context_sum, step_cost
from relaykv.sim.hardware import HardwareSpec
from relaykv.sim.models import LayerKind, ModelSpec


def _model(**kw) -> ModelSpec:
    base = dict(
        name="hand",
        total_params=1000.0,
        active_params=1000.0,
        hidden_size=16,
        vocab_size=50,
        # 2 full layers, 4 query heads x 8: attention FLOPs 4 * 32 = 128 per attended token
        # per layer; 1 KV head x 8 in bf16: 2 * 8 * 2 = 32 KV bytes per token per layer.
        layers=(LayerKind("full", None, 2, 4, 8, 1, 32),),
    )
    base.update(kw)
    return ModelSpec(**base)


HW = HardwareSpec(
    "hand",
    peak_flops=1e6,
    hbm_bandwidth=1e4,
    memory_bytes=1e9,
    interconnect_bandwidth=1e3,
    mfu=1.0,
    mbu=1.0,
    step_overhead_s=0.01,
    allreduce_latency_s=0.001,
    draft_pass_overhead_s=0.0,
)


def test_context_sums_by_hand() -> None:
    assert context_sum(0, 4, None) == 1 + 2 + 3 + 4
    assert context_sum(10, 1, None) == 11
    assert context_sum(6, 3, 4) == 4 + 4 + 4  # every position sees a full window
    assert context_sum(2, 4, 4) == 3 + 4 + 4 + 4  # the window fills up on the way
    assert context_sum(0, 2, 4) == 1 + 2
    assert context_sum(5, 0, 4) == 0
    for start in range(12):
        for new in range(6):
            brute = sum(min(p + 1, 5) for p in range(start, start + new))
            assert context_sum(start, new, 5) == brute
    assert context_len(100, None) == 100
    assert context_len(100, 16) == 16
    assert context_len(100, None, compression=4) == 25


def test_prefill_step_memory_bound_by_hand() -> None:
    cost = step_cost(_model(), HW, 1, [SeqShape(0, 4)])
    # FLOPs: 2 * 1000 params * 4 tokens + 128 * (1+2+3+4) * 2 layers = 8000 + 2560.
    assert cost.flops == 10560
    # bytes: 1000 params * 2 + 32 B * (4 read + 4 written) * 2 layers = 2000 + 512.
    assert cost.bytes == 2512
    # max(10560 / 1e6, 2512 / 1e4) + 0.01 overhead.
    assert cost.seconds == pytest.approx(0.01 + 0.2512)
    # A calibrated machine's serving overheads: + 3 ms per sequence + 1 ms per token.
    served = replace(HW, per_sequence_overhead_s=3e-3, per_token_overhead_s=1e-3)
    two = step_cost(_model(), served, 1, [SeqShape(0, 4), SeqShape(8, 1)])
    plain = step_cost(_model(), HW, 1, [SeqShape(0, 4), SeqShape(8, 1)])
    assert two.seconds == pytest.approx(plain.seconds + 2 * 3e-3 + 5 * 1e-3)


def test_compute_bound_sliding_and_tp_by_hand() -> None:
    model = _model(layers=(LayerKind("sliding", 4, 2, 4, 8, 1, 32),), active_params=1e5)
    hw = HardwareSpec(
        "hand",
        peak_flops=1e6,
        hbm_bandwidth=1e9,
        memory_bytes=1e9,
        interconnect_bandwidth=1e3,
        mfu=0.5,
        mbu=1.0,
        step_overhead_s=0.0,
        allreduce_latency_s=0.001,
        draft_pass_overhead_s=0.0,
    )
    # 4 tokens from position 2: windowed contexts 3 + 4 + 4 + 4 = 15.
    one = step_cost(model, hw, 1, [SeqShape(2, 4)])
    assert one.flops == 2 * 1e5 * 4 + 128 * 15 * 2
    assert one.seconds == pytest.approx(one.flops / (1e6 * 0.5))
    two = step_cost(model, hw, 2, [SeqShape(2, 4)])
    # Half the compute per device, plus 2 all-reduces per layer of 4 tokens x 16 x 2 bytes
    # = 128 bytes each: ring 2 * (2-1)/2 * 128 / 1e3 s + 1 ms latency = 0.129 s.
    assert two.allreduce_s == pytest.approx(2 * 2 * 0.129)
    assert two.seconds == pytest.approx(one.flops / (2 * 1e6 * 0.5) + 4 * 0.129)


def test_moe_weight_bytes_by_hand() -> None:
    # 10 params total, 4 active, 4 experts with 1 per token: experts hold 6 / 0.75 = 8.
    moe = _model(total_params=10.0, active_params=4.0, num_experts=4, experts_per_token=1)
    assert moe.expert_params == pytest.approx(8.0)
    assert moe.dense_params == pytest.approx(2.0)
    assert moe.weight_bytes(1) == pytest.approx(2 * 2 + 8 * 0.25 * 2)
    assert moe.weight_bytes(2) == pytest.approx(2 * 2 + 8 * (1 - 0.75**2) * 2)
    assert moe.weight_bytes(10**6) == pytest.approx(2 * 10)


def test_decode_reads_kv_and_verification_is_a_prefill_of_k_plus_1() -> None:
    model = _model()
    decode = step_cost(model, HW, 1, [SeqShape(100, 1)])
    # KV read at position 100: 101 entries read + 1 written, 32 B each, 2 layers.
    assert decode.bytes == 2000 + 32 * 102 * 2
    verify = step_cost(model, HW, 1, [SeqShape(100, 3)])
    assert verify.flops == 2 * 1000 * 3 + 128 * (101 + 102 + 103) * 2


def test_draft_proposals_cost_k_passes() -> None:
    draft = LayerKind("full", None, 1, 4, 8, 1, 32)
    model = _model(draft=draft, draft_params=100.0)
    plain = step_cost(model, HW, 1, [SeqShape(10, 1, proposals=0)])
    spec = step_cost(model, HW, 1, [SeqShape(10, 1, proposals=3)])
    # each pass: draft weights 100 * 2 B + KV of the draft layer (12 read/written entries
    # at position 11: 12 + 1) * 32 B, memory bound at 1e4 B/s.
    one_pass = (200 + 32 * 13) / 1e4
    assert spec.draft_s == pytest.approx(3 * one_pass)
    assert spec.seconds == pytest.approx(plain.seconds + 3 * one_pass)
