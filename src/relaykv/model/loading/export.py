"""Our modules -> Hugging Face names (inverse of `weight_map`), and saving a HF directory.

Used to run transformers on exactly our weights (tiny-hybrid, GGUF models) in the
benchmark, and to hand tiny-hybrid to any tool that reads HF checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from relaykv.model.config import to_hf_dict
from relaykv.model.layers import DecoderLayer
from relaykv.model.transformer import CausalLM


def layer_state(layer: DecoderLayer, prefix: str, sandwich: bool) -> dict[str, torch.Tensor]:
    attn = layer.self_attn
    d, h, kvh = attn.head_dim, attn.num_heads, attn.num_kv_heads
    out: dict[str, torch.Tensor] = {}
    for name, part in zip(
        "qkv", attn.qkv_proj.weight.split([h * d, kvh * d, kvh * d], 0), strict=True
    ):
        out[f"{prefix}self_attn.{name}_proj.weight"] = part
    if attn.qkv_proj.bias is not None:
        parts = attn.qkv_proj.bias.split([h * d, kvh * d, kvh * d], 0)
        for name, part in zip("qkv", parts, strict=True):
            out[f"{prefix}self_attn.{name}_proj.bias"] = part
    out[f"{prefix}self_attn.o_proj.weight"] = attn.o_proj.weight
    if attn.o_proj.bias is not None:
        out[f"{prefix}self_attn.o_proj.bias"] = attn.o_proj.bias
    if attn.q_norm is not None and attn.k_norm is not None:
        out[f"{prefix}self_attn.q_norm.weight"] = attn.q_norm.weight
        out[f"{prefix}self_attn.k_norm.weight"] = attn.k_norm.weight
    gate, up = layer.mlp.gate_up_proj.weight.split(layer.mlp.intermediate, 0)
    out[f"{prefix}mlp.gate_proj.weight"] = gate
    out[f"{prefix}mlp.up_proj.weight"] = up
    out[f"{prefix}mlp.down_proj.weight"] = layer.mlp.down_proj.weight
    if layer.input_norm is not None:
        out[f"{prefix}input_layernorm.weight"] = layer.input_norm.weight
    if sandwich:
        assert layer.attn_out_norm is not None and layer.mlp_out_norm is not None
        out[f"{prefix}post_attention_layernorm.weight"] = layer.attn_out_norm.weight
        out[f"{prefix}pre_feedforward_layernorm.weight"] = layer.mlp_norm.weight
        out[f"{prefix}post_feedforward_layernorm.weight"] = layer.mlp_out_norm.weight
    else:
        out[f"{prefix}post_attention_layernorm.weight"] = layer.mlp_norm.weight
    return out


def hf_state_dict(model: CausalLM) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' `*ForCausalLM` names."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight}
    for i, layer in enumerate(model.layers):
        out.update(layer_state(layer, f"model.layers.{i}.", model.config.sandwich_norm))  # type: ignore[arg-type]
    out["model.norm.weight"] = model.norm.weight
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head.weight
    return {k: v.detach() for k, v in out.items()}


def save_hf_dir(model: CausalLM, path: str | Path) -> Path:
    """Write config.json + model.safetensors (loadable by us and by transformers)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(to_hf_dict(model.config), indent=1))
    tensors = {k: v.contiguous().cpu() for k, v in hf_state_dict(model).items()}
    save_file(tensors, str(root / "model.safetensors"))
    return root
