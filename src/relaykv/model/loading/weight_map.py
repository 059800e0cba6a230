"""Hugging Face tensor names -> our modules (fused QKV and gate/up, Gemma norm names).

Every parameter must be filled exactly once: a missing tensor or an unknown one is an
error naming it (a silently random weight is the worst loading bug there is).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from relaykv.model.layers import DecoderLayer
from relaykv.model.transformer import CausalLM

# Tensors a text-only runtime may skip: RoPE buffers, multimodal towers.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|^vision_tower\.|^multi_modal_projector\.)")
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")


def strip_prefix(name: str) -> str:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _copy(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(
            f"tensor {name}: shape {tuple(value.shape)}, expected {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.copy_(value.to(dtype=param.dtype, device=param.device))


def _take(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return tensors.pop(name)
    except KeyError:
        raise ValueError(f"checkpoint is missing tensor {name!r}") from None


def load_layer(
    layer: DecoderLayer, tensors: dict[str, torch.Tensor], prefix: str, sandwich: bool
) -> None:
    """Fill one decoder layer from HF-named tensors `{prefix}self_attn.q_proj.weight`, ..."""
    attn = layer.self_attn
    parts = [_take(tensors, f"{prefix}self_attn.{p}_proj.weight") for p in "qkv"]
    _copy(attn.qkv_proj.weight, torch.cat(parts, 0), f"{prefix}self_attn.qkv")
    if attn.qkv_proj.bias is not None:
        parts = [_take(tensors, f"{prefix}self_attn.{p}_proj.bias") for p in "qkv"]
        _copy(attn.qkv_proj.bias, torch.cat(parts, 0), f"{prefix}self_attn.qkv bias")
    _copy(attn.o_proj.weight, _take(tensors, f"{prefix}self_attn.o_proj.weight"), "o_proj")
    if attn.o_proj.bias is not None:
        _copy(attn.o_proj.bias, _take(tensors, f"{prefix}self_attn.o_proj.bias"), "o_proj bias")
    if attn.q_norm is not None and attn.k_norm is not None:
        _copy(attn.q_norm.weight, _take(tensors, f"{prefix}self_attn.q_norm.weight"), "q_norm")
        _copy(attn.k_norm.weight, _take(tensors, f"{prefix}self_attn.k_norm.weight"), "k_norm")
    gate = _take(tensors, f"{prefix}mlp.gate_proj.weight")
    up = _take(tensors, f"{prefix}mlp.up_proj.weight")
    _copy(layer.mlp.gate_up_proj.weight, torch.cat([gate, up], 0), f"{prefix}mlp.gate_up")
    _copy(layer.mlp.down_proj.weight, _take(tensors, f"{prefix}mlp.down_proj.weight"), "down_proj")
    if layer.input_norm is not None:
        _copy(
            layer.input_norm.weight, _take(tensors, f"{prefix}input_layernorm.weight"), "input_norm"
        )
    if sandwich:
        assert layer.attn_out_norm is not None and layer.mlp_out_norm is not None
        _copy(
            layer.attn_out_norm.weight,
            _take(tensors, f"{prefix}post_attention_layernorm.weight"),
            "post_attention",
        )
        _copy(
            layer.mlp_norm.weight,
            _take(tensors, f"{prefix}pre_feedforward_layernorm.weight"),
            "pre_feedforward",
        )
        _copy(
            layer.mlp_out_norm.weight,
            _take(tensors, f"{prefix}post_feedforward_layernorm.weight"),
            "post_feedforward",
        )
    else:
        _copy(
            layer.mlp_norm.weight,
            _take(tensors, f"{prefix}post_attention_layernorm.weight"),
            "post_attention",
        )


def load_hf_weights(model: CausalLM, named: Mapping[str, torch.Tensor]) -> None:
    """Fill `model` from a HF state dict (any of the usual prefixes); strict."""
    tensors = {}
    for name, value in named.items():
        short = strip_prefix(name)
        if _IGNORED.search(short) or _IGNORED.search(name):
            continue
        tensors[short] = value
    cfg = model.config
    _copy(model.embed_tokens.weight, _take(tensors, "embed_tokens.weight"), "embed_tokens")
    for i, layer in enumerate(model.layers):
        load_layer(layer, tensors, f"layers.{i}.", cfg.sandwich_norm)  # type: ignore[arg-type]
    _copy(model.norm.weight, _take(tensors, "norm.weight"), "norm")
    head = tensors.pop("lm_head.weight", None)
    if model.lm_head is not None:
        if head is None:
            raise ValueError(
                "checkpoint is missing tensor 'lm_head.weight' (embeddings are not tied)"
            )
        _copy(model.lm_head.weight, head, "lm_head")
    if tensors:
        unknown = ", ".join(sorted(tensors)[:8])
        raise ValueError(
            f"checkpoint has {len(tensors)} tensors this model does not use: {unknown}"
        )
