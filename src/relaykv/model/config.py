"""Model configuration: one normalized record for the decoder-only family we run.

Llama, Qwen3 (with per-layer `layer_types`), Mistral (a window on every layer) and
Gemma-3 text (5 sliding : 1 full, separate RoPE bases, (1 + w) norms, scaled embeddings,
sandwich norms, tied embeddings) differ only in a handful of switches, so one
`ModelConfig` with those switches describes all of them. `from_hf_dict` reads a
Hugging Face `config.json` in both the transformers 4.x layout (`rope_theta`,
`rope_scaling`, `rope_local_base_freq`) and the 5.x layout (`rope_parameters`, per layer
type for Gemma-3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from relaykv.common.layer_kinds import layer_kinds

LayerType = Literal["full_attention", "sliding_attention"]
LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention")
ARCHITECTURES: tuple[str, ...] = ("llama", "qwen3", "mistral", "gemma3")
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_pytorch_tanh")


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary embedding parameters of one layer type (HF `rope_parameters` entry)."""

    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("default", "linear", "llama3"):
            raise ValueError(
                f"unsupported rope type {self.rope_type!r} (supported: default, linear, llama3)"
            )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the runtime needs to build and run one target model."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int | None = None
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    rope: dict[str, RopeSpec] = field(default_factory=dict)  # per layer type
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    # Gemma conventions: RMSNorm scales by (offset + w), embeddings are multiplied by
    # sqrt(hidden), each sub-block has a post norm and the MLP a pre norm ("sandwich").
    norm_offset: float = 0.0
    embed_scale: float = 1.0
    sandwich_norm: bool = False
    attn_scale: float | None = None  # None: head_dim ** -0.5
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )
        if len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
            )
        for kind in self.layer_types:
            if kind not in LAYER_TYPES:
                raise ValueError(f"unknown layer type {kind!r}; expected one of {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("sliding layers need a sliding_window >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported activation {self.hidden_act!r}")
        for kind in set(self.layer_types):
            if kind not in self.rope:
                raise ValueError(f"no RoPE parameters for layer type {kind!r}")

    @property
    def scaling(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5

    def window_of(self, layer: int) -> int | None:
        """The sliding window of a layer, None for full attention."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def with_updates(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)

    @property
    def num_parameters(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * h * self.intermediate_size
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp) + emb


def _rope_from_dict(d: dict[str, Any] | None, default_theta: float) -> RopeSpec:
    d = dict(d or {})
    rope_type = d.get("rope_type", d.get("type", "default")) or "default"
    return RopeSpec(
        theta=float(d.get("rope_theta", default_theta)),
        rope_type=rope_type,
        factor=float(d.get("factor", 1.0)),
        low_freq_factor=float(d.get("low_freq_factor", 1.0)),
        high_freq_factor=float(d.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(d.get("original_max_position_embeddings", 8192)),
    )


def _rope_specs(d: dict[str, Any], gemma: bool) -> dict[str, RopeSpec]:
    params = d.get("rope_parameters")
    if gemma:
        # transformers 5.x: rope_parameters keyed by layer type; 4.x: rope_theta (global),
        # rope_local_base_freq (local) and rope_scaling applied to the global layers only.
        if isinstance(params, dict) and "full_attention" in params:
            return {
                "full_attention": _rope_from_dict(params.get("full_attention"), 1_000_000.0),
                "sliding_attention": _rope_from_dict(params.get("sliding_attention"), 10_000.0),
            }
        full = dict(d.get("rope_scaling") or {})
        full["rope_theta"] = d.get("rope_theta", 1_000_000.0)
        local = {"rope_theta": d.get("rope_local_base_freq", 10_000.0)}
        return {
            "full_attention": _rope_from_dict(full, 1_000_000.0),
            "sliding_attention": _rope_from_dict(local, 10_000.0),
        }
    if isinstance(params, dict) and params:
        spec = _rope_from_dict(params, float(d.get("rope_theta", 10000.0)))
    else:
        merged = dict(d.get("rope_scaling") or {})
        merged["rope_theta"] = d.get("rope_theta", 10000.0)
        spec = _rope_from_dict(merged, 10000.0)
    return {"full_attention": spec, "sliding_attention": spec}


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def from_hf_dict(raw: dict[str, Any]) -> ModelConfig:
    """Normalize a Hugging Face `config.json` dict (Llama, Qwen3, Mistral, Gemma-3 text)."""
    d = dict(raw)
    model_type = d.get("model_type", "")
    if model_type == "gemma3" and "text_config" in d:
        # The multimodal Gemma-3 wrapper: the language model is the text config.
        text = dict(d["text_config"] or {})
        text.setdefault("model_type", "gemma3_text")
        for key in ("bos_token_id", "eos_token_id"):
            if key in d and key not in text:
                text[key] = d[key]
        d = text
        model_type = "gemma3_text"
    arch = {
        "llama": "llama",
        "qwen3": "qwen3",
        "mistral": "mistral",
        "gemma3_text": "gemma3",
        "gemma3": "gemma3",
    }.get(model_type)
    if arch is None:
        raise ValueError(
            f"unsupported model_type {model_type!r}; supported: llama, qwen3, mistral, gemma3_text"
        )
    num_layers = int(d["num_hidden_layers"])
    num_heads = int(d["num_attention_heads"])
    hidden = int(d["hidden_size"])
    head_dim = int(d.get("head_dim") or hidden // num_heads)
    gemma = arch == "gemma3"
    kinds = layer_kinds(d)
    if gemma and d.get("attn_logit_softcapping"):
        raise ValueError("attention logit softcapping (Gemma-2 style) is not supported")
    if gemma and d.get("use_bidirectional_attention"):
        raise ValueError("bidirectional Gemma-3 attention is not supported (decoder-only runtime)")
    act = (
        d.get("hidden_activation")
        or d.get("hidden_act")
        or ("gelu_pytorch_tanh" if gemma else "silu")
    )
    if act in ("gelu_tanh", "gelu_new"):
        act = "gelu_pytorch_tanh"
    return ModelConfig(
        architecture=arch,
        vocab_size=int(d["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(d["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
        head_dim=head_dim,
        layer_types=kinds.types,
        sliding_window=kinds.window,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        hidden_act=act,
        rope=_rope_specs(d, gemma),
        max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),
        attention_bias=bool(d.get("attention_bias", False)),
        qk_norm=arch in ("qwen3", "gemma3"),
        norm_offset=1.0 if gemma else 0.0,
        embed_scale=math.sqrt(hidden) if gemma else 1.0,
        sandwich_norm=gemma,
        attn_scale=float(d.get("query_pre_attn_scalar", 256)) ** -0.5 if gemma else None,
        final_logit_softcapping=d.get("final_logit_softcapping") if gemma else None,
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=_eos_ids(d.get("eos_token_id")),
    )


def _rope_to_dict(spec: RopeSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": spec.rope_type, "rope_theta": spec.theta}
    if spec.rope_type == "linear":
        out["factor"] = spec.factor
    elif spec.rope_type == "llama3":
        out.update(
            factor=spec.factor,
            low_freq_factor=spec.low_freq_factor,
            high_freq_factor=spec.high_freq_factor,
            original_max_position_embeddings=spec.original_max_position_embeddings,
        )
    return out


def to_hf_dict(config: ModelConfig) -> dict[str, Any]:
    """A transformers 5.x `config.json` dict for this config (inverse of `from_hf_dict`)."""
    c = config
    d: dict[str, Any] = {
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.attention_bias,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": list(c.eos_token_ids) if len(c.eos_token_ids) != 1 else c.eos_token_ids[0],
    }
    full = c.rope.get("full_attention") or c.rope["sliding_attention"]
    if c.architecture == "gemma3":
        d.update(
            model_type="gemma3_text",
            architectures=["Gemma3ForCausalLM"],
            hidden_activation=c.hidden_act,
            layer_types=list(c.layer_types),
            sliding_window=c.sliding_window,
            query_pre_attn_scalar=round(c.scaling**-2),
            final_logit_softcapping=c.final_logit_softcapping,
            rope_parameters={k: _rope_to_dict(v) for k, v in c.rope.items()},
        )
        return d
    d.update(hidden_act=c.hidden_act, rope_parameters=_rope_to_dict(full))
    if c.architecture == "qwen3":
        sliding = "sliding_attention" in c.layer_types
        d.update(
            model_type="qwen3",
            architectures=["Qwen3ForCausalLM"],
            layer_types=list(c.layer_types),
            use_sliding_window=sliding,
            sliding_window=c.sliding_window,
            max_window_layers=0,
        )
    elif c.architecture == "mistral":
        d.update(
            model_type="mistral",
            architectures=["MistralForCausalLM"],
            sliding_window=c.sliding_window,
        )
    else:
        d.update(model_type="llama", architectures=["LlamaForCausalLM"])
    return d
