"""Rotary position embeddings (rotate-half convention, as in Hugging Face models).

cos/sin are computed per step from the absolute positions of the step's tokens
(`positions * inv_freq` in float32, exactly as transformers does), so any chunk may start
anywhere and no table has to be sized in advance.
"""

from __future__ import annotations

import math

import torch

from relaykv.model.config import RopeSpec


def inverse_frequencies(spec: RopeSpec, head_dim: int) -> torch.Tensor:
    """inv_freq of length head_dim/2 for one RoPE spec (default, linear, llama3)."""
    inv = 1.0 / (spec.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if spec.rope_type == "linear":
        return inv / spec.factor
    if spec.rope_type == "llama3":
        old_len = spec.original_max_position_embeddings
        low_wavelen = old_len / spec.low_freq_factor
        high_wavelen = old_len / spec.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / spec.factor, inv)
        smooth = (old_len / wavelen - spec.low_freq_factor) / (
            spec.high_freq_factor - spec.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / spec.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv


class RotaryEmbedding:
    """cos/sin for a set of positions; one instance per distinct RoPE spec."""

    def __init__(self, spec: RopeSpec, head_dim: int, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.head_dim = head_dim
        self.inv_freq = inverse_frequencies(spec, head_dim).to(device)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, head_dim] cos and sin for int64 positions [T]."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by per-token cos/sin [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
