"""Step time of one engine step from its batch (docs/simulator.md "Cost model").

For a step whose sequences compute `n_i` new tokens each starting at position `s_i`
(a prefill chunk, a decode token, or a speculative verification of k+1 tokens: the same
formula), on an engine of TP t:

* FLOPs = 2 * active_params * T  (T = sum n_i; MoE: active parameters only)
        + per attention layer, 4 * q_heads * head_dim * sum over new positions p of the
          context it attends to: p+1 (full), min(p+1, W) (sliding), divided by the
          compression of a compressed full-context layer;
        + the draft: 2 * draft_params per token it reads (prompt and verified tokens) and
          per proposal;
* bytes = weights read once per step (dense + the experts the step's tokens touch,
          `ModelSpec.weight_bytes`) + per sequence the KV its attention reads (per layer
          kind `kv_bytes_per_token * context`, windowed for sliding) + the KV it writes;
  (`kv_bandwidth`, when set, serves the KV part: a calibrated CPU pages KV far slower
  than it streams weights; GPU presets leave it at the HBM bandwidth);
* time = overhead + per-sequence overhead * sequences + per-token overhead * T
         + max(FLOPs / (t * peak * MFU), bytes / (t * HBM * MBU))    [combine = max]
           or the sum of both                                          [combine = sum]
         + all-reduces: 2 per layer of T * hidden * 2 bytes, ring over NVLink:
           2 (t-1)/t * size / bandwidth + latency each (0 when t = 1)
         + draft proposals: k passes of one token per sequence, each memory-bound on the
           draft's weights, plus a fixed per-pass overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relaykv.sim.hardware import HardwareSpec
from relaykv.sim.models import LayerKind, ModelSpec


@dataclass(frozen=True, slots=True)
class SeqShape:
    """One sequence of a step: `new` tokens computed from position `start`; `proposals`
    draft tokens proposed after it (k when it samples and proposes, else 0)."""

    start: int
    new: int
    proposals: int = 0


@dataclass(frozen=True, slots=True)
class StepCost:
    flops: float
    bytes: float
    allreduce_s: float
    draft_s: float
    seconds: float


def context_sum(start: int, new: int, window: int | None) -> int:
    """Sum over positions p in [start, start+new) of the attended context length:
    p+1 for full attention, min(p+1, window) for sliding."""
    lo, hi = start + 1, start + new  # context lengths p+1 run over [lo, hi]
    if new <= 0:
        return 0
    if window is None or hi <= window:
        return (lo + hi) * new // 2
    if lo > window:
        return window * new
    below = (lo + window) * (window - lo + 1) // 2  # lengths lo..window
    return below + window * (hi - window)


def context_len(end: int, window: int | None, compression: int = 1) -> int:
    """KV entries attention reads for a query at the last position `end - 1`."""
    span = end if window is None else min(end, window)
    return -(-span // compression)


def _attention(kind: LayerKind, seqs: Sequence[SeqShape]) -> tuple[float, float]:
    flops = 0.0
    read = 0.0
    per_layer = 4.0 * kind.num_q_heads * kind.head_dim
    for s in seqs:
        ctx = context_sum(s.start, s.new, kind.window) / kind.compression
        flops += per_layer * ctx
        read += kind.kv_bytes_per_token * (
            context_len(s.start + s.new, kind.window, kind.compression) + s.new
        )
    return flops * kind.num_layers, read * kind.num_layers


@dataclass(frozen=True, slots=True)
class StepTerms:
    """The hardware-independent terms of a step (what calibration regresses on).

    `flops` / `bytes`: the target + draft forward over the step's tokens; `passes`: draft
    proposal passes (k when any sequence proposes); `pass_flops` / `pass_bytes`: one such
    pass over every proposing sequence; `allreduce_bytes`: bytes of one all-reduce;
    `kv_bytes` / `pass_kv_bytes`: the part of `bytes` / `pass_bytes` that is KV (paged
    reads, which a CPU serves much slower than streaming weights: `kv_bandwidth`).
    """

    num_seqs: int
    tokens: int
    flops: float
    bytes: float
    passes: int
    pass_flops: float
    pass_bytes: float
    allreduce_bytes: float
    kv_bytes: float = 0.0
    pass_kv_bytes: float = 0.0


def step_terms(model: ModelSpec, seqs: Sequence[SeqShape]) -> StepTerms:
    tokens = sum(s.new for s in seqs)
    flops = 2.0 * model.active_params * tokens
    nbytes = model.weight_bytes(tokens)
    kv = 0.0
    for kind in model.layers:
        f, b = _attention(kind, seqs)
        flops += f
        kv += b
    passes, pass_flops, pass_bytes, pass_kv = 0, 0.0, 0.0, 0.0
    if model.draft is not None and model.draft_params:
        flops += 2.0 * model.draft_params * tokens
        f, b = _attention(model.draft, seqs)
        flops += f
        kv += b
        proposing = [s for s in seqs if s.proposals]
        if proposing:
            passes = max(s.proposals for s in proposing)
            one = [SeqShape(s.start + s.new, 1) for s in proposing]
            df, db = _attention(model.draft, one)
            pass_flops = 2.0 * model.draft_params * len(one) + df
            pass_bytes = model.draft_params * model.dense_weight_bytes + db
            pass_kv = db
    return StepTerms(
        len(seqs),
        tokens,
        flops,
        nbytes + kv,
        passes,
        pass_flops,
        pass_bytes,
        tokens * model.hidden_size * 2.0,
        kv,
        pass_kv,
    )


def step_cost(model: ModelSpec, hw: HardwareSpec, tp: int, seqs: Sequence[SeqShape]) -> StepCost:
    """The modelled duration of one step (the module docstring's formula)."""
    if tp < 1:
        raise ValueError(f"tensor parallel size must be >= 1, got {tp}")
    t = step_terms(model, seqs)
    one_pass = _combine(hw, tp, t.pass_flops, t.pass_bytes, t.pass_kv_bytes)
    draft_s = t.passes * (hw.draft_pass_overhead_s + one_pass)
    allreduce_s = 0.0
    if tp > 1:
        ring = 2.0 * (tp - 1) / tp * t.allreduce_bytes / hw.interconnect_bandwidth
        allreduce_s = 2 * model.num_layers * (ring + hw.allreduce_latency_s)
    seconds = (
        hw.step_overhead_s
        + hw.per_sequence_overhead_s * t.num_seqs
        + hw.per_token_overhead_s * t.tokens
        + _combine(hw, tp, t.flops, t.bytes, t.kv_bytes)
        + allreduce_s
        + draft_s
    )
    return StepCost(t.flops, t.bytes, allreduce_s, draft_s, seconds)


def _combine(hw: HardwareSpec, tp: int, flops: float, nbytes: float, kv: float) -> float:
    compute = flops / (tp * hw.peak_flops * hw.mfu)
    kv_bandwidth = hw.kv_bandwidth or hw.hbm_bandwidth
    memory = (nbytes - kv) / (tp * hw.hbm_bandwidth * hw.mbu) + kv / (tp * kv_bandwidth * hw.mbu)
    return max(compute, memory) if hw.combine == "max" else compute + memory


def estimated_max_suffix(
    model: ModelSpec, hw: HardwareSpec, tp: int, trip_s: float, context: int
) -> int:
    """Conditional disaggregation's cost estimate (docs/routing.md): the longest suffix, in
    multiples of 16 tokens, whose prefill on a decode engine (at the end of a `context`-token
    prompt, on top of a decode step) costs no more than the P trip's fixed `trip_s`."""

    def extra(n: int) -> float:
        start = max(0, context - n)
        with_suffix = step_cost(model, hw, tp, [SeqShape(start, n), SeqShape(context, 1)])
        alone = step_cost(model, hw, tp, [SeqShape(context, 1)])
        return with_suffix.seconds - alone.seconds

    lo, hi = 0, max(16, context) // 16  # in units of 16 tokens: extra(16 lo) <= trip
    if extra(16) > trip_s:
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if extra(16 * mid) <= trip_s:
            lo = mid
        else:
            hi = mid - 1
    return 16 * lo
