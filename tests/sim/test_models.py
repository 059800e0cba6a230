"""Model shapes: the geometry the simulator derives is the one the real engine builds."""

from __future__ import annotations

import pytest

from relaykv.kvcache import preset
from relaykv.sim.model_presets import PRESETS, from_hf_config, model_spec


def test_tiny_hybrid_geometry_equals_the_model_layers() -> None:
    torch = pytest.importorskip("torch")
    from relaykv.model.kv_layout import DraftAttention, derive_layout
    from relaykv.model.presets import tiny_hybrid_config

    spec = model_spec("tiny-hybrid")
    real = derive_layout(tiny_hybrid_config(), 16, torch.float32, DraftAttention(2, 64)).geometry
    assert spec.geometry(with_draft=True) == real
    plain = derive_layout(tiny_hybrid_config(), 16, torch.float32).geometry
    assert spec.geometry(with_draft=False) == plain


def test_gemma_page_balancing_equals_the_model_layers() -> None:
    torch = pytest.importorskip("torch")
    from relaykv.model.config import from_hf_dict
    from relaykv.model.kv_layout import derive_layout

    raw = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "hidden_size": 640,
        "intermediate_size": 2048,
        "vocab_size": 262144,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
    }
    real = derive_layout(from_hf_dict(raw), 16, torch.bfloat16).geometry
    assert from_hf_config(raw).geometry(with_draft=False) == real
    assert model_spec("gemma3-270m").geometry(with_draft=False) == real
    assert len(real.groups) == 6  # 3 full in one group, 15 sliding split 5 x 3


def test_gpt_oss_matches_the_kvcache_preset_shape() -> None:
    geo = model_spec("gpt-oss-20b").geometry(with_draft=True)
    ref = preset("gpt-oss-like")
    assert [(g.kind, g.block_size, g.window, g.draft) for g in geo.groups] == [
        (g.kind, g.block_size, g.window, g.draft) for g in ref.groups
    ]
    # 8 KV heads x 64 x 2 (K, V) x 2 bytes = 2 KiB per token per layer; 12 + draft layers.
    assert [g.bytes_per_token for g in geo.groups] == [13 * 2048, 12 * 2048]
    spec = model_spec("gpt-oss-20b")
    assert spec.active_params / spec.total_params == pytest.approx(3.6 / 20.9)


def test_dsv4_flash_has_a_large_alignment_and_a_sliding_draft() -> None:
    geo = model_spec("dsv4-flash").geometry(with_draft=True)
    assert geo.alignment == 256
    assert [g.draft for g in geo.groups] == [False, True]
    assert sum(g.bytes_per_token for g in geo.groups) == 16272
    assert not model_spec("dsv4-flash").geometry(with_draft=False).eagle


def test_hf_config_moe_and_unknown_names(tmp_path) -> None:
    cfg = {
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "intermediate_size": 32,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 32,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    spec = from_hf_config(cfg)
    assert spec.num_experts == 8 and spec.active_params < spec.total_params
    assert [g.kind for g in spec.geometry(False).groups] == ["full", "sliding"]
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    assert model_spec(str(tmp_path)).num_layers == 4
    with pytest.raises(ValueError, match="unknown model"):
        model_spec("no-such-model")
    assert set(PRESETS) == {"tiny-hybrid", "gemma3-270m", "gpt-oss-20b", "dsv4-flash"}


def test_hf_config_honours_qwen3_sliding_window_fields() -> None:
    raw = {
        "model_type": "qwen3",
        "num_hidden_layers": 8,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "intermediate_size": 32,
        "sliding_window": 32,
        "max_window_layers": 6,
    }
    # Qwen3 ignores sliding_window unless use_sliding_window is set (the model does too).
    assert [(g.kind, g.num_layers) for g in from_hf_config(raw).geometry(False).groups] == [
        ("full", 8)
    ]
    spec = from_hf_config({**raw, "use_sliding_window": True})
    assert [(k.kind, k.window, k.num_layers) for k in spec.layers] == [
        ("sliding", 32, 2),
        ("full", None, 6),
    ]
    # Page balancing: 6 full layers in 3 groups of 2, as many as the sliding kind holds.
    assert [(g.kind, g.num_layers) for g in spec.geometry(False).groups] == [
        ("full", 2),
        ("full", 2),
        ("full", 2),
        ("sliding", 2),
    ]
