"""Decoder building blocks: RMSNorm, self-attention projections, gated MLP, decoder layer.

Every module works on flattened steps: tokens of all sequences of a step are rows of one
`[T, hidden]` tensor, so projections and MLPs are one matmul per layer for the whole
batch. Attention itself is delegated to the forward context (`ctx.attention`), which
knows the step's positions, pages and plans; a dense context is used for training the
tiny draft. Q/K/V and gate/up projections are stored fused (one matmul instead of three).
The projections are `packed_linear.Linear`s: the runner may prepack their CPU weights.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from relaykv.model.config import ModelConfig
from relaykv.model.kv_layout import LayerKey
from relaykv.model.packed_linear import Linear
from relaykv.model.rope import apply_rotary


class AttentionContext(Protocol):
    """What a layer needs from the step it runs in (see `forward_context`)."""

    def rotary(self, rope_key: str) -> tuple[torch.Tensor, torch.Tensor]: ...

    def attention(
        self,
        layer_key: LayerKey,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    """RMSNorm; `offset=1` is Gemma's `x * (1 + w)` computed in float32 before the cast."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (xf * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * xf.to(x.dtype)


class SelfAttention(nn.Module):
    """Fused QKV projection, optional per-head q/k norm, RoPE, paged attention, output."""

    def __init__(
        self, config: ModelConfig, rope_key: str, window: int | None, layer_key: LayerKey
    ) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.scaling
        self.rope_key = rope_key
        self.window = window
        self.layer_key: LayerKey = layer_key  # the context maps it to a (group, index) slot
        d = self.head_dim
        self.qkv_proj = Linear(
            config.hidden_size,
            (self.num_heads + 2 * self.num_kv_heads) * d,
            bias=config.attention_bias,
        )
        self.o_proj = Linear(self.num_heads * d, config.hidden_size, bias=config.attention_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps, config.norm_offset)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, config.norm_offset)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        d = self.head_dim
        q, k, v = self.qkv_proj(x).split(
            [self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1
        )
        q = q.view(t, self.num_heads, d)
        k = k.view(t, self.num_kv_heads, d)
        v = v.view(t, self.num_kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        cos, sin = ctx.rotary(self.rope_key)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out = ctx.attention(self.layer_key, q, k, v, self.scale, self.window)
        return self.o_proj(out.reshape(t, self.num_heads * d))


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gelu = config.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(act * up)


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer; Gemma adds post-attention and post-MLP norms ("sandwich").

    Norm names: `input_norm` (HF input_layernorm), `mlp_norm` (Llama's
    post_attention_layernorm, Gemma's pre_feedforward_layernorm), `attn_out_norm` (Gemma's
    post_attention_layernorm), `mlp_out_norm` (Gemma's post_feedforward_layernorm).
    `input_norm=False` builds the EAGLE-1 draft layer, whose input is not normalized.
    """

    def __init__(
        self,
        config: ModelConfig,
        rope_key: str,
        window: int | None,
        layer_key: LayerKey,
        input_norm: bool = True,
    ) -> None:
        super().__init__()
        eps, off = config.rms_norm_eps, config.norm_offset
        self.input_norm = RMSNorm(config.hidden_size, eps, off) if input_norm else None
        self.self_attn = SelfAttention(config, rope_key, window, layer_key)
        self.mlp_norm = RMSNorm(config.hidden_size, eps, off)
        self.mlp = GatedMLP(config)
        self.attn_out_norm: RMSNorm | None = None
        self.mlp_out_norm: RMSNorm | None = None
        if config.sandwich_norm:
            self.attn_out_norm = RMSNorm(config.hidden_size, eps, off)
            self.mlp_out_norm = RMSNorm(config.hidden_size, eps, off)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        h = self.input_norm(x) if self.input_norm is not None else x
        h = self.self_attn(h, ctx)
        if self.attn_out_norm is not None:
            h = self.attn_out_norm(h)
        x = x + h
        h = self.mlp(self.mlp_norm(x))
        if self.mlp_out_norm is not None:
            h = self.mlp_out_norm(h)
        return x + h
