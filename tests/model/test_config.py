"""Config normalization from HF config.json dicts (transformers 4.x and 5.x layouts)."""

from __future__ import annotations

import pytest

from relaykv.model.config import from_hf_dict, to_hf_dict
from relaykv.model.presets import tiny_hybrid_config

BASE = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def test_gemma3_defaults_and_old_rope_layout():
    cfg = from_hf_dict(
        {
            **BASE,
            "model_type": "gemma3_text",
            "sliding_window": 512,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "head_dim": 32,
            "query_pre_attn_scalar": 48,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        }
    )
    assert cfg.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert cfg.rope["full_attention"].theta == 1e6
    assert cfg.rope["full_attention"].factor == 8.0
    assert cfg.rope["sliding_attention"].theta == 1e4
    assert cfg.rope["sliding_attention"].rope_type == "default"
    assert cfg.scaling == pytest.approx(48**-0.5)
    assert cfg.embed_scale == pytest.approx(8.0) and cfg.norm_offset == 1.0
    assert cfg.tie_word_embeddings and cfg.sandwich_norm and cfg.qk_norm


def test_gemma3_multimodal_wrapper_uses_text_config():
    text = {**BASE, "sliding_window": 16, "head_dim": 16}
    cfg = from_hf_dict({"model_type": "gemma3", "text_config": text, "eos_token_id": [1, 106]})
    assert cfg.architecture == "gemma3" and cfg.eos_token_ids == (1, 106)


def test_qwen3_sliding_needs_use_sliding_window():
    raw = {**BASE, "model_type": "qwen3", "sliding_window": 32, "max_window_layers": 4}
    assert from_hf_dict(raw).layer_types == ("full_attention",) * 6
    cfg = from_hf_dict({**raw, "use_sliding_window": True})
    assert cfg.layer_types == ("full_attention",) * 4 + ("sliding_attention",) * 2
    explicit = ["sliding_attention", "full_attention"] * 3
    cfg = from_hf_dict({**raw, "use_sliding_window": True, "layer_types": explicit})
    assert cfg.layer_types == tuple(explicit) and cfg.sliding_window == 32


def test_mistral_slides_everywhere_llama_nowhere():
    assert (
        from_hf_dict({**BASE, "model_type": "mistral", "sliding_window": 8}).layer_types
        == ("sliding_attention",) * 6
    )
    assert (
        from_hf_dict({**BASE, "model_type": "mistral", "sliding_window": None}).layer_types
        == ("full_attention",) * 6
    )
    llama = from_hf_dict(
        {
            **BASE,
            "model_type": "llama",
            "sliding_window": 8,
            "rope_scaling": {"type": "llama3", "factor": 8.0},
        }
    )
    assert llama.sliding_window is None and llama.rope["full_attention"].rope_type == "llama3"


@pytest.mark.parametrize(
    "raw,match",
    [
        ({**BASE, "model_type": "gpt2"}, "unsupported model_type"),
        ({**BASE, "model_type": "llama", "rope_scaling": {"type": "yarn"}}, "unsupported rope"),
        ({**BASE, "model_type": "gemma3_text", "attn_logit_softcapping": 50.0}, "softcapping"),
    ],
)
def test_unsupported_configs_are_named(raw, match):
    with pytest.raises(ValueError, match=match):
        from_hf_dict(raw)


def test_round_trip_through_hf_dict():
    tiny = tiny_hybrid_config()
    assert from_hf_dict(to_hf_dict(tiny)) == tiny
    gemma = from_hf_dict(
        {
            **BASE,
            "model_type": "gemma3_text",
            "sliding_window": 16,
            "head_dim": 16,
            "final_logit_softcapping": 30.0,
        }
    )
    assert from_hf_dict(to_hf_dict(gemma)) == gemma
