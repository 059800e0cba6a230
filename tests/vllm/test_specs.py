"""vLLM's KV cache groups map onto relaykv's geometry and back (relaykv/vllm/specs.py)."""

from __future__ import annotations

import pytest

from tests.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from relaykv.kvcache.geometry import PRESETS, Geometry, parse_groups, preset
from relaykv.vllm.specs import (
    UnsupportedKVCacheSpec,
    geometry_from_kv_cache_config,
    kv_cache_config_for,
)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip(name: str) -> None:
    geometry = preset(name)
    config = kv_cache_config_for(geometry, 64)
    # Kinds, sizes, windows and draft marks (layer counts and bytes are the probe's own).
    assert geometry_from_kv_cache_config(config, eagle=geometry.eagle).describe() == (
        geometry.describe()
    )


@pytest.mark.parametrize(
    "groups", ["full:16", "sliding:4:13", "full:8,chunked:4:32", "full:2,sliding:4:5,sliding:8:9"]
)
@pytest.mark.parametrize("draft", [None, 0, -1])
def test_kinds_and_draft_marks_round_trip(groups: str, draft: int | None) -> None:
    geometry = Geometry(parse_groups(groups))
    if draft is not None:
        geometry = geometry.with_draft(draft % geometry.num_groups)
    config = kv_cache_config_for(geometry, 64)
    assert [g.is_eagle_group for g in config.kv_cache_groups] == [
        geometry.eagle and g.draft for g in geometry.groups
    ]
    back = geometry_from_kv_cache_config(config, eagle=geometry.eagle)
    assert back.describe() == geometry.describe()


def _spec(cls: type, **kw: object) -> object:
    return cls(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16, **kw)


def test_eagle_without_a_flagged_group_marks_every_group() -> None:
    """vLLM and relaykv share the rule: EAGLE on and no draft group flagged -> all groups."""
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["a"], _spec(FullAttentionSpec)),
            KVCacheGroupSpec(["b"], _spec(SlidingWindowSpec, sliding_window=64)),
        ],
    )
    geometry = geometry_from_kv_cache_config(config, eagle=True)
    assert geometry.draft_groups == (0, 1)
    assert geometry_from_kv_cache_config(config, eagle=False).draft_groups == ()


def test_layers_and_page_bytes_carry_over() -> None:
    spec = _spec(SlidingWindowSpec, sliding_window=128)
    config = KVCacheConfig(
        num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["a", "b", "c"], spec)]
    )
    (group,) = geometry_from_kv_cache_config(config, eagle=False).groups
    assert group.num_layers == 3 and group.page_bytes == 3 * spec.page_size_bytes


def test_a_group_without_a_relaykv_rule_is_refused_by_name() -> None:
    mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float32,))
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["a"], _spec(FullAttentionSpec)),
            KVCacheGroupSpec(["m"], mamba),
        ],
    )
    with pytest.raises(UnsupportedKVCacheSpec, match="group 1 \\(MambaSpec\\)"):
        geometry_from_kv_cache_config(config, eagle=False)


def test_a_full_spec_carrying_a_window_needs_the_hybrid_manager() -> None:
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["a"], _spec(FullAttentionSpec, sliding_window=64))],
    )
    with pytest.raises(UnsupportedKVCacheSpec, match="hybrid"):
        geometry_from_kv_cache_config(config, eagle=False)
