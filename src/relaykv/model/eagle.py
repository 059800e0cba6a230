"""EAGLE-style draft model: one decoder layer over (next-token embedding, target hidden).

At position p the draft input is `fc(cat(embed(token[p+1]), hidden[p]))`, with `hidden[p]`
the target's final-norm hidden state at p (HF's last `hidden_states` entry) and RoPE
position p; its output at p predicts token p+2 through the target's LM head (after the
draft's own final norm if the checkpoint has one). Embeddings and LM head are the
target's. Drafting k tokens feeds the draft's own output back as the next `hidden`
(EAGLE-1). The layer's KV lives in the draft-marked group (`kv_layout`).

Checkpoint layout (EAGLE-1, SafeAILab): a directory with `config.json` (a one-layer HF
config: llama / qwen3 / mistral; mistral or a qwen3 `sliding_attention` layer makes the
draft sliding) and `model.safetensors` or `pytorch_model.bin` with `fc.weight`,
`fc.bias` (optional), `layers.0.*` in HF names (`input_layernorm` optional: EAGLE-1 has
none), `norm.weight` (optional), and `embed_tokens.weight` (ignored: shared).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from relaykv.model.config import ModelConfig, from_hf_dict, to_hf_dict
from relaykv.model.kv_layout import DRAFT_LAYER, DraftAttention
from relaykv.model.layers import AttentionContext, DecoderLayer, RMSNorm
from relaykv.model.loading.export import layer_state
from relaykv.model.loading.weight_map import load_layer
from relaykv.model.packed_linear import Linear
from relaykv.model.rope import RotaryEmbedding
from relaykv.model.transformer import materialize

DRAFT_ROPE_KEY = "draft"


class EagleDraft(nn.Module):
    """The draft layer; `config` is a one-layer config with the target's hidden size."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        fc_bias: bool = True,
        input_norm: bool = False,
        final_norm: bool = False,
    ) -> None:
        super().__init__()
        if config.num_layers != 1:
            raise ValueError(f"an EAGLE draft has one layer, config has {config.num_layers}")
        self.config = config
        self.window = config.window_of(0)
        h = config.hidden_size
        self.fc = Linear(2 * h, h, bias=fc_bias)
        self.layer = DecoderLayer(
            config, DRAFT_ROPE_KEY, self.window, layer_key=DRAFT_LAYER, input_norm=input_norm
        )
        self.norm = RMSNorm(h, config.rms_norm_eps, config.norm_offset) if final_norm else None
        self.rotaries: dict[str, RotaryEmbedding] = {}

    def attention_shape(self) -> DraftAttention:
        return DraftAttention(self.config.num_kv_heads, self.config.head_dim, self.window)

    def build_rotaries(self) -> dict[str, RotaryEmbedding]:
        spec = self.config.rope[self.config.layer_types[0]]
        self.rotaries = {
            DRAFT_ROPE_KEY: RotaryEmbedding(spec, self.config.head_dim, self.fc.weight.device)
        }
        return self.rotaries

    def check_target(self, target: ModelConfig) -> None:
        if target.hidden_size != self.config.hidden_size:
            raise ValueError(
                f"draft hidden size {self.config.hidden_size} != "
                f"target hidden size {target.hidden_size}"
            )

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """Draft output `[T, hidden]` (pre-norm: fed back as the next step's hidden)."""
        x = self.fc(torch.cat([embeds, hidden.to(embeds.dtype)], dim=-1))
        return self.layer(x, ctx)

    def head_input(self, out: torch.Tensor) -> torch.Tensor:
        return self.norm(out) if self.norm is not None else out


def draft_config_for(target: ModelConfig, window: int | None = None) -> ModelConfig:
    """A one-layer draft config in the target's family (shape of the target's layers)."""
    kind = "sliding_attention" if window else "full_attention"
    rope = target.rope.get(kind) or next(iter(target.rope.values()))
    # The draft layer is a plain pre-norm layer even for Gemma targets (EAGLE-1 layout).
    arch = "qwen3" if target.qk_norm else ("mistral" if window else "llama")
    return target.with_updates(
        architecture=arch,
        num_layers=1,
        layer_types=(kind,),
        sliding_window=window,
        rope={kind: rope},
        norm_offset=0.0,
        embed_scale=1.0,
        sandwich_norm=False,
        attn_scale=None,
        final_logit_softcapping=None,
        tie_word_embeddings=True,
    )


def random_draft(
    target: ModelConfig,
    seed: int = 0,
    window: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> EagleDraft:
    """A randomly initialised draft (deterministic for a seed); for tests."""
    config = draft_config_for(target, window)
    with torch.device("meta"):
        draft = EagleDraft(config, fc_bias=True)
    draft = materialize(draft, "cpu")  # to_empty's meta path imports sympy (~1 s)
    init_draft_weights(draft, seed)
    return draft.to(dtype)


def init_draft_weights(draft: EagleDraft, seed: int) -> None:
    """Deterministic start for a draft: unit norms, zero biases, N(0, 1/fan_in) weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                std = param.shape[-1] ** -0.5
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def load_eagle_checkpoint(
    path: str | Path, target: ModelConfig, dtype: torch.dtype = torch.float32
) -> EagleDraft:
    """Load a draft from an EAGLE checkpoint directory (layout in the module docstring)."""
    root = Path(path)
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{root}: not an EAGLE checkpoint directory (no config.json)")
    raw = json.loads(config_file.read_text())
    raw = {**raw, "num_hidden_layers": 1, "vocab_size": raw.get("vocab_size", target.vocab_size)}
    if isinstance(raw.get("layer_types"), list):
        raw["layer_types"] = raw["layer_types"][:1]
    config = from_hf_dict(raw)
    if (root / "model.safetensors").is_file():
        tensors = load_file(str(root / "model.safetensors"))
    elif (root / "pytorch_model.bin").is_file():
        tensors = torch.load(root / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"{root}: no model.safetensors or pytorch_model.bin")
    tensors = {k.removeprefix("model."): v for k, v in tensors.items()}
    tensors.pop("embed_tokens.weight", None)
    draft = EagleDraft(
        config,
        fc_bias="fc.bias" in tensors,
        input_norm="layers.0.input_layernorm.weight" in tensors,
        final_norm="norm.weight" in tensors,
    )
    draft.check_target(target)
    with torch.no_grad():
        draft.fc.weight.copy_(tensors.pop("fc.weight"))
        if draft.fc.bias is not None:
            draft.fc.bias.copy_(tensors.pop("fc.bias"))
        if draft.norm is not None:
            draft.norm.weight.copy_(tensors.pop("norm.weight"))
    load_layer(draft.layer, tensors, "layers.0.", sandwich=False)
    if tensors:
        raise ValueError(
            f"{root}: unexpected tensors in the draft checkpoint: {sorted(tensors)[:8]}"
        )
    return draft.to(dtype)


def save_eagle_checkpoint(draft: EagleDraft, path: str | Path) -> Path:
    """Write `draft` in the EAGLE checkpoint layout (config.json + model.safetensors)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(to_hf_dict(draft.config), indent=1))
    tensors = {"fc.weight": draft.fc.weight, **layer_state(draft.layer, "layers.0.", False)}
    if draft.fc.bias is not None:
        tensors["fc.bias"] = draft.fc.bias
    if draft.norm is not None:
        tensors["norm.weight"] = draft.norm.weight
    save_file(
        {k: t.detach().contiguous().cpu() for k, t in tensors.items()},
        str(root / "model.safetensors"),
    )
    return root
