"""Geometry derived from model configs (groups, draft placement, bytes per token)."""

from __future__ import annotations

import torch

from relaykv.model.config import from_hf_dict
from relaykv.model.kv_layout import DraftAttention, derive_layout, geometry_from_config
from relaykv.model.presets import tiny_hybrid_config

GEMMA = from_hf_dict(
    {
        "model_type": "gemma3_text",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "sliding_window": 512,
    }
)


def test_gemma3_270m_shape():
    layout = derive_layout(GEMMA, block_size=16)
    geo = layout.geometry
    full, *sliding = geo.groups
    assert (full.kind, full.num_layers, full.window) == ("full", 3, None)
    # Page balancing: the 15 sliding layers form 5 groups of 3, interleaved, so every group's
    # page is 3 layers and no pool block is 5x larger than a full-attention page.
    assert [(g.kind, g.num_layers, g.window) for g in sliding] == [("sliding", 3, 512)] * 5
    assert full.bytes_per_token == 3 * 2 * 1 * 256 * 4
    assert all(g.bytes_per_token == full.bytes_per_token for g in sliding)
    assert geo.block_bytes == 16 * full.bytes_per_token
    sliding_layers = [i for i in range(18) if i % 6 != 5]
    assert [layout.layer_slots[i].group for i in sliding_layers] == [1, 2, 3, 4, 5] * 3
    assert not geo.eagle and geo.draft_groups == ()


def test_draft_joins_its_kind_as_last_layer():
    cfg = tiny_hybrid_config()
    layout = derive_layout(cfg, 16, torch.bfloat16, DraftAttention(2, 64))
    assert layout.geometry.groups[0].draft and layout.geometry.groups[0].num_layers == 4
    assert layout.draft_slot is not None and (layout.draft_slot.group, layout.draft_slot.index) == (
        0,
        3,
    )
    assert layout.geometry.groups[0].bytes_per_token == 4 * 2 * 2 * 64 * 2  # bf16
    sliding = derive_layout(cfg, 16, torch.float32, DraftAttention(2, 64, window=64))
    assert sliding.geometry.groups[1].draft and sliding.geometry.groups[1].num_layers == 4
    assert sliding.geometry.draft_groups == (1,)
    assert [s.group for s in sliding.layer_slots] == [1, 0, 1, 0, 1, 0]


def test_draft_without_a_matching_group_gets_its_own():
    mistral = from_hf_dict(
        {
            "model_type": "mistral",
            "vocab_size": 10,
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "sliding_window": 8,
        }
    )
    geo = geometry_from_config(mistral, 4, draft=DraftAttention(2, 16))
    assert [(g.kind, g.draft, g.num_layers) for g in geo.groups] == [
        ("full", True, 1),
        ("sliding", False, 2),
    ]
    assert geo.eagle and geo.alignment == 4
