"""The target model: a decoder-only transformer over flattened steps.

`forward(ids, ctx)` returns the final-norm hidden states of every row (EAGLE needs them
all); `logits(hidden)` applies the LM head only to the rows the caller selects, so a
prefill chunk costs one LM-head row, not one per token.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from relaykv.model.config import ModelConfig
from relaykv.model.layers import AttentionContext, DecoderLayer, RMSNorm
from relaykv.model.rope import RotaryEmbedding

M = TypeVar("M", bound=nn.Module)


def empty_model(
    config: ModelConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> CausalLM:
    """A model with uninitialised parameters (no init cost, no global RNG use): fill it."""
    with torch.device("meta"):
        model = CausalLM(config)
    return materialize(model, device).to(dtype)


def materialize(module: M, device: torch.device | str) -> M:
    """`module.to_empty(device=...)` without its `empty_like`: on meta tensors that goes
    through torch's Python reference ops, whose first use imports sympy (~1 s a process)."""
    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


class CausalLM(nn.Module):
    """Llama / Qwen3 / Mistral / Gemma-3 text, selected by `ModelConfig` switches."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # Built uninitialised (`empty_model` fills every parameter): nn.Embedding's own
        # normal_ init has no native meta kernel, and on the meta device it imports torch's
        # Python decompositions (~800 modules, 2-4 s of every process's startup).
        table = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=table)
        self.layers = nn.ModuleList(
            DecoderLayer(config, config.layer_types[i], config.window_of(i), layer_key=i)
            for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotaries: dict[str, RotaryEmbedding] = {}

    # -- setup ------------------------------------------------------------------------
    def build_rotaries(self) -> dict[str, RotaryEmbedding]:
        device = self.embed_tokens.weight.device
        self.rotaries = {
            kind: RotaryEmbedding(spec, self.config.head_dim, device)
            for kind, spec in self.config.rope.items()
        }
        return self.rotaries

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # -- compute ------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        if self.config.embed_scale != 1.0:
            # Gemma multiplies by sqrt(hidden) rounded to the runtime dtype (as HF does).
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype, device=x.device)
        return x

    def forward(self, ids: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Final-norm hidden states `[T, hidden]` for token ids `[T]`."""
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, ctx)
        return self.norm(x)

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits `[R, vocab]` for selected hidden rows `[R, hidden]`."""
        out = F.linear(hidden, self.head_weight()).float()
        cap = self.config.final_logit_softcapping
        if cap:
            out = torch.tanh(out / cap) * cap
        return out
