"""Built-in models: the embedded `tiny-hybrid` and the names of the packaged real models.

`tiny-hybrid` is a Qwen3-family model (so transformers can run the very same weights as
a reference) with 6 layers alternating sliding(W=64) and full attention, hidden 256,
4 query / 2 KV heads of 64, vocabulary = the 259-id byte tokenizer, about 5 M parameters.
Its weights come from a fixed seed, scaled so that every layer matters (unit-variance
embeddings, 1/sqrt(fan_in) projections, norms 1 +- 0.1) and the logits are spread out
(std ~3), which keeps greedy ties, and so run-to-run flips, out of the tests.
"""

from __future__ import annotations

import torch

from relaykv.common.model_names import PACKAGED as PACKAGED
from relaykv.common.model_names import PRESET_NAMES as PRESET_NAMES
from relaykv.model.config import ModelConfig, RopeSpec
from relaykv.model.transformer import CausalLM, empty_model

TINY_HYBRID_SEED = 20240611
TINY_HYBRID_WINDOW = 64


def tiny_hybrid_config() -> ModelConfig:
    rope = RopeSpec(theta=10000.0)
    return ModelConfig(
        architecture="qwen3",
        vocab_size=259,
        hidden_size=256,
        intermediate_size=768,
        num_layers=6,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        layer_types=("sliding_attention", "full_attention") * 3,
        sliding_window=TINY_HYBRID_WINDOW,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        rope={"full_attention": rope, "sliding_attention": rope},
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        qk_norm=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    )


def init_random_weights(
    model: CausalLM,
    seed: int,
    embed_std: float = 1.0,
    head_std: float = 0.2,
    norm_jitter: float = 0.1,
    residual_scale: float = 1.0,
) -> CausalLM:
    """Deterministic random weights (float32 draws on CPU, then cast), parameters by name."""
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if name.endswith("norm.weight"):
                base = 0.0 if model.config.norm_offset else 1.0
                value = base + norm_jitter * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                value = torch.zeros(p.shape)
            elif name == "embed_tokens.weight":
                value = embed_std * torch.randn(p.shape, generator=gen)
            elif name == "lm_head.weight":
                value = head_std * torch.randn(p.shape, generator=gen)
            else:
                value = torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    value = value * residual_scale
            p.copy_(value.to(dtype=p.dtype, device=p.device))
    return model


def tiny_hybrid(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> CausalLM:
    config = tiny_hybrid_config()
    # GPT-2's residual init (1/sqrt(2 * layers) on the projections into the residual).
    model = init_random_weights(
        empty_model(config), TINY_HYBRID_SEED, residual_scale=(2 * config.num_layers) ** -0.5
    )
    return model.to(device=device, dtype=dtype)
