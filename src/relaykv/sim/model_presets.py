"""Named model shapes (`--model`) and HF `config.json` parsing (docs/simulator.md "Models").

Sources: tiny-hybrid is `relaykv.model.presets.tiny_hybrid_config` (6 layers alternating
sliding W=64 / full, 2 KV heads x 64, float32 on CPU) with its distilled EAGLE draft (one
full-attention layer of the same shape); gemma3-270m is Gemma-3-270M's `config.json` (18
layers, 5 sliding W=512 : 1 full, 1 KV head x 256); gpt-oss-20b is openai/gpt-oss-20b's
`config.json` (24 layers alternating sliding W=128 / full, 64 query / 8 KV heads x 64,
32 experts, 4 per token, 20.9 B total / 3.6 B active, MXFP4 experts) with the
RedHatAI EAGLE3 speculator (one full-attention layer, 8 KV heads x 64, in the full group);
dsv4-flash is an approximation documented in `dsv4_flash`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relaykv.common.layer_kinds import layer_kinds
from relaykv.kvcache import Geometry, GroupSpec
from relaykv.sim.models import LayerKind, ModelSpec

BF16 = 2


def _attn(kind: str, window: int | None, n: int, q: int, kvh: int, hd: int, elem: int) -> LayerKind:
    return LayerKind(kind, window, n, q, hd, kvh, 2 * kvh * hd * elem)


def tiny_hybrid() -> ModelSpec:
    f32 = 4
    return ModelSpec(
        name="tiny-hybrid",
        total_params=5.0e6,
        active_params=5.0e6,
        hidden_size=256,
        vocab_size=259,
        layers=(_attn("sliding", 64, 3, 4, 2, 64, f32), _attn("full", None, 3, 4, 2, 64, f32)),
        dense_weight_bytes=f32,
        draft=_attn("full", None, 1, 4, 2, 64, f32),
        draft_params=0.9e6,
    )


def gemma3_270m() -> ModelSpec:
    return ModelSpec(
        name="gemma3-270m",
        total_params=268e6,
        active_params=268e6,
        hidden_size=640,
        vocab_size=262144,
        layers=(
            _attn("sliding", 512, 15, 4, 1, 256, BF16),
            _attn("full", None, 3, 4, 1, 256, BF16),
        ),
        draft=_attn("full", None, 1, 4, 1, 256, BF16),
        draft_params=30e6,
    )


def gpt_oss_20b() -> ModelSpec:
    return ModelSpec(
        name="gpt-oss-20b",
        total_params=20.9e9,
        active_params=3.6e9,
        hidden_size=2880,
        vocab_size=201088,
        layers=(
            _attn("sliding", 128, 12, 64, 8, 64, BF16),
            _attn("full", None, 12, 64, 8, 64, BF16),
        ),
        num_experts=32,
        experts_per_token=4,
        dense_weight_bytes=BF16,
        expert_weight_bytes=4.25 / 8,  # MXFP4: 4-bit values + one 8-bit scale per 32
        draft=_attn("full", None, 1, 64, 8, 64, BF16),
        # EAGLE3 draft: one decoder layer (~0.25 B) + fc + its own 32k-vocab head (~0.1 B).
        draft_params=0.35e9,
    )


def dsv4_flash() -> ModelSpec:
    """DeepSeek-V4-Flash-like (no public config; every number here is an approximation).

    * 43 MoE layers, hidden 4096, 256 routed experts, 6 per token: 284 B total / 13 B active
      (a Flash-sized DeepSeek-V3-family model), weights FP8 (1 byte per parameter);
    * attention split the V4 way: 21 compressed full-context layers (MLA latent 512 + rope
      64 in FP8 = 576 B per entry, one entry per 4 tokens: 144 B/token/layer) and 22
      sliding layers with a 128-token window (MLA latent in FP8, 576 B/token/layer);
    * KV groups (block size in tokens): full compressed b=256 (21 layers: 3,024 B/token),
      sliding b=64 W=128 holding the MTP/EAGLE draft layer (22 + 1 layers: 13,248 B/token),
      so the hit alignment A = 256 and the draft is in the sliding group (the case of the upstream
      report, vLLM PR #56449, docs/design.md §11);
    * KV bytes per token = 16,272 (66 % of it in the windowed group, which only keeps 128
      tokens per request, so a 65k prompt holds ~49 MB in the full group + 2.5 MB window).
    """
    full = LayerKind("full", None, 21, 64, 128, 1, 144, compression=4)
    sliding = LayerKind("sliding", 128, 22, 64, 128, 1, 576)
    geometry = Geometry(
        (
            GroupSpec("full", 256, num_layers=21, bytes_per_token=21 * 144),
            GroupSpec("sliding", 64, 128, draft=True, num_layers=23, bytes_per_token=23 * 576),
        )
    )
    return ModelSpec(
        name="dsv4-flash",
        total_params=284e9,
        active_params=13e9,
        hidden_size=4096,
        vocab_size=129280,
        layers=(full, sliding),
        num_experts=256,
        experts_per_token=6,
        dense_weight_bytes=1.0,
        expert_weight_bytes=1.0,
        draft=LayerKind("sliding", 128, 1, 64, 128, 1, 576),
        draft_params=0.9e9,
        geometry_override=geometry,
    )


PRESETS = {
    "tiny-hybrid": tiny_hybrid,
    "gemma3-270m": gemma3_270m,
    "gpt-oss-20b": gpt_oss_20b,
    "dsv4-flash": dsv4_flash,
}


def model_spec(name: str) -> ModelSpec:
    """A preset by name, or an HF `config.json` path (a file or the directory holding it)."""
    if name in PRESETS:
        return PRESETS[name]()
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"unknown model {name!r}: a preset ({', '.join(PRESETS)}) or a config.json"
        )
    return from_hf_config(json.loads(path.read_text()), name=path.parent.name or name)


def from_hf_config(raw: dict[str, Any], name: str = "hf-model") -> ModelSpec:
    """A `ModelSpec` from an HF config (dense or MoE; its layers' kinds as the engine reads
    them, `relaykv.common.layer_kinds`); parameter counts from the shapes, bf16."""
    d = dict(raw.get("text_config") or raw)
    if "model_type" in raw:
        d.setdefault("model_type", raw["model_type"])
    layers_n = int(d["num_hidden_layers"])
    hidden = int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    kvh = int(d.get("num_key_value_heads") or heads)
    hd = int(d.get("head_dim") or hidden // heads)
    kinds_of = layer_kinds(d)
    n_sliding = kinds_of.num_sliding
    kinds = []
    if kinds_of.window is not None and n_sliding:
        kinds.append(_attn("sliding", kinds_of.window, n_sliding, heads, kvh, hd, BF16))
    if layers_n - n_sliding:
        kinds.append(_attn("full", None, layers_n - n_sliding, heads, kvh, hd, BF16))
    vocab = int(d["vocab_size"])
    experts = int(
        d.get("num_local_experts") or d.get("num_experts") or d.get("n_routed_experts") or 0
    )
    per_tok = int(d.get("num_experts_per_tok") or d.get("experts_per_token") or 0)
    inter = int(d.get("moe_intermediate_size") or d.get("intermediate_size") or 4 * hidden)
    attn = hidden * hd * (2 * heads + 2 * kvh)
    mlp = 3 * hidden * inter
    embed = vocab * hidden * (1 if d.get("tie_word_embeddings") else 2)
    if experts:
        total = layers_n * (attn + experts * mlp) + embed
        active = layers_n * (attn + per_tok * mlp) + embed
    else:
        total = active = layers_n * (attn + mlp) + embed
    return ModelSpec(
        name=name,
        total_params=float(total),
        active_params=float(active),
        hidden_size=hidden,
        vocab_size=vocab,
        layers=tuple(kinds),
        num_experts=experts,
        experts_per_token=per_tok if experts else 0,
        draft=_attn("full", None, 1, heads, kvh, hd, BF16),
        draft_params=float(attn + mlp + vocab * hidden),
    )
