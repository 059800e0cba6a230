"""GGUF files (llama.cpp format) via the `gguf` package, dequantized to float32.

Conventions undone here (llama.cpp's converter applies them when writing the file):
* Llama: Q and K rows are permuted for llama.cpp's interleaved RoPE; we permute them back
  to the rotate-half layout of HF models.
* Gemma: RMSNorm weights are stored as (1 + w); HF Gemma (and we) keep w, so 1 is
  subtracted. Gemma-3 files do not record the 5:1 sliding pattern, the local RoPE base or
  the query scaling; llama.cpp hard-codes them (pattern 6, base 10000, 1/sqrt(head_dim),
  except the 62-layer 27B model with 1/sqrt(hidden/heads)), and so do we unless the file
  carries them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from relaykv.model.config import ModelConfig, RopeSpec
from relaykv.model.loading.gguf_header import GGUFHeader

SUPPORTED = ("llama", "qwen3", "gemma3")

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED)}"
        )
    if "rope_freqs.weight" in tensor_names:
        raise ValueError(
            "GGUF files with a rope_freqs tensor (Llama-3.1 RoPE scaling) are not supported"
        )

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    hidden = int(get("embedding_length"))
    layers = int(get("block_count"))
    heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    theta = float(get("rope.freq_base", 10000.0))
    scaling_type = get("rope.scaling.type")
    full_rope = RopeSpec(theta=theta)
    if scaling_type == "linear":
        full_rope = RopeSpec(
            theta=theta, rope_type="linear", factor=float(get("rope.scaling.factor"))
        )
    elif scaling_type not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling {scaling_type!r}")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    common: dict[str, Any] = dict(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(get("context_length", 8192)),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
    )
    if arch == "gemma3":
        window = int(get("attention.sliding_window", 512))
        pattern = get("attention.sliding_window_pattern", 6)
        if isinstance(pattern, list):
            kinds = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            kinds = [
                "sliding_attention" if (i + 1) % int(pattern) else "full_attention"
                for i in range(layers)
            ]
        scalar = hidden // heads if layers == 62 else head_dim
        scale = get("attention.scale")
        local = RopeSpec(theta=float(get("rope.freq_base_swa", 10000.0)))
        return ModelConfig(
            architecture="gemma3",
            layer_types=tuple(kinds),
            sliding_window=window,
            hidden_act="gelu_pytorch_tanh",
            rope={"full_attention": full_rope, "sliding_attention": local},
            qk_norm=True,
            norm_offset=1.0,
            embed_scale=hidden**0.5,
            sandwich_norm=True,
            attn_scale=float(scale) if scale else scalar**-0.5,
            **common,
        )
    rope = {"full_attention": full_rope, "sliding_attention": full_rope}
    return ModelConfig(
        architecture=arch,
        layer_types=("full_attention",) * layers,
        rope=rope,
        qk_norm=arch == "qwen3",
        **common,
    )


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved pairs -> rotate-half halves)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str, arch: str) -> str | None:
    if name == "token_embd.weight":
        return "embed_tokens.weight"
    if name == "output_norm.weight":
        return "norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk":
        return None
    _, layer, base, suffix = parts
    if base == "ffn_norm":
        target = "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"
    else:
        target = _LAYER_NAMES.get(base, "")
    if not target:
        return None
    return f"layers.{layer}.{target}.{suffix}"


def read_gguf(
    path: str | Path, progress: bool = True
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, float32 tensors in HF names, metadata) of a GGUF file."""
    from gguf.quants import dequantize

    header = GGUFHeader(path)
    meta = header.metadata
    names = {t.name for t in header.tensors}
    config = config_from_metadata(meta, names)
    arch = config.architecture
    tensors: dict[str, torch.Tensor] = {}
    for t in tqdm(
        header.tensors,
        desc=f"dequantizing {Path(path).name}",
        disable=None if progress else True,
        leave=False,
    ):
        hf = _hf_name(t.name, arch)
        if hf is None:
            raise ValueError(f"{path}: unexpected GGUF tensor {t.name!r}")
        values = np.asarray(dequantize(header.raw(t), t.ggml_type), dtype=np.float32)
        if arch == "llama" and t.name.endswith("attn_q.weight"):
            values = _unpermute(values, config.num_heads)
        elif arch == "llama" and t.name.endswith("attn_k.weight"):
            values = _unpermute(values, config.num_kv_heads)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            values = values - 1.0
        if not values.flags.writeable or not values.flags.c_contiguous:
            values = np.array(values, order="C")  # F32 tensors are read-only memmap views
        tensors[hf] = torch.from_numpy(values)
    return config, tensors, meta
