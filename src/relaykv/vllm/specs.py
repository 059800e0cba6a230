"""vLLM's KV cache groups as relaykv's geometry, and back (docs/vllm.md "Groups").

vLLM 0.33 describes a model's KV cache as `KVCacheGroupSpec`s, each with one `KVCacheSpec`
and an `is_eagle_group` flag (the group holds an EAGLE draft's layers). relaykv's rules
(`relaykv.kvcache.groups`) take a `Geometry` of `GroupSpec`s; this module is the one
translation between the two:

| vLLM spec                   | relaykv group                     |
|-----------------------------|-----------------------------------|
| `FullAttentionSpec`, `MLAAttentionSpec` | `full(b)`             |
| `SlidingWindowSpec(W)`      | `sliding(b, W)`                   |
| `ChunkedLocalAttentionSpec(C)` | `chunked(b, C)`                |
| `is_eagle_group` (under the EAGLE block drop) | `draft`         |

Every other spec (Mamba, cross attention, DeepSeek-V4.1's bounded-replay sliding window,
sink or ring buffers, a full spec carrying a window because the hybrid manager is off) has
no relaykv rule: `geometry_from_kv_cache_config` refuses it with a message naming the group.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

from relaykv.kvcache.geometry import KIND_PARAMETER, Geometry, GroupSpec

# vLLM spec class -> relaykv kind and the vLLM field holding the kind's parameter (W, C);
# relaykv's own field for it is `geometry.KIND_PARAMETER[kind]`. Read in both directions.
_KINDS: dict[type[KVCacheSpec], tuple[str, str | None]] = {
    FullAttentionSpec: ("full", None),
    MLAAttentionSpec: ("full", None),
    SlidingWindowSpec: ("sliding", "sliding_window"),
    ChunkedLocalAttentionSpec: ("chunked", "attention_chunk_size"),
}
_VLLM_SPECS = {
    kind: (cls, field) for cls, (kind, field) in _KINDS.items() if cls is not MLAAttentionSpec
}


class UnsupportedKVCacheSpec(ValueError):
    """A vLLM KV cache group relaykv has no rule for."""


def group_spec(group: KVCacheGroupSpec, index: int, draft: bool) -> GroupSpec:
    """One vLLM KV cache group as a relaykv `GroupSpec`."""
    spec = group.kv_cache_spec
    found = _KINDS.get(type(spec))
    if found is None:
        raise UnsupportedKVCacheSpec(
            f"KV cache group {index} ({type(spec).__name__}) has no relaykv rule; "
            "relaykv.vllm supports full, sliding-window and chunked-local attention groups "
            "(use pd_policy=legacy for stock vLLM)"
        )
    kind, field = found
    if field is None and (
        getattr(spec, "sliding_window", None) is not None
        or getattr(spec, "attention_chunk_size", None) is not None
    ):
        raise UnsupportedKVCacheSpec(
            f"KV cache group {index}: a full-attention spec carrying a window (vLLM's "
            "hybrid KV cache manager is disabled); relaykv.vllm needs the hybrid manager"
        )
    own = KIND_PARAMETER[kind]
    parameter = {} if field is None or own is None else {own[0]: getattr(spec, field)}
    layers = max(1, len(group.layer_names))
    b = spec.block_size
    return GroupSpec(
        kind,
        b,
        draft=draft,
        num_layers=layers,
        bytes_per_token=spec.page_size_bytes * layers // b,
        **parameter,
    )


def geometry_from_kv_cache_config(kv_cache_config: KVCacheConfig, *, eagle: bool) -> Geometry:
    """relaykv's geometry of a vLLM KV cache config. `eagle`: vLLM applies the EAGLE block
    drop (`Scheduler.use_eagle_block_drop`); its draft groups (`is_eagle_group`) become
    relaykv draft groups, and with none flagged every group counts, in both systems."""
    groups = tuple(
        group_spec(group, i, draft=eagle and group.is_eagle_group)
        for i, group in enumerate(kv_cache_config.kv_cache_groups)
    )
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        if not group.kv_cache_spec.prefix_cacheable or isinstance(
            group.kv_cache_spec, SlidingWindowMLASpec
        ):
            raise UnsupportedKVCacheSpec(f"KV cache group {i} is not prefix-cacheable")
    return Geometry(groups, eagle=eagle)


def vllm_spec(group: GroupSpec, dtype: torch.dtype = torch.bfloat16) -> KVCacheSpec:
    """A vLLM spec for one relaykv group (the probe builds vLLM engines from geometries)."""
    cls, field = _VLLM_SPECS[group.kind]
    extra: dict[str, Any] = {} if field is None else {field: group.parameter}
    return cls(
        block_size=group.block_size,
        num_kv_heads=1,
        head_size=8,
        dtype=dtype,
        is_draft=group.draft,
        **extra,
    )


def kv_cache_config_for(
    geometry: Geometry, num_blocks: int, retention_interval: int | None = 0
) -> KVCacheConfig:
    """A vLLM KV cache config with one group per relaykv group, the draft flags kept.
    `retention_interval` is what vLLM's planner copies from `CacheConfig` (0 by default:
    sliding groups keep their latest replay boundary only)."""
    groups = [
        KVCacheGroupSpec([f"layer.{i}"], vllm_spec(g), is_eagle_group=geometry.eagle and g.draft)
        for i, g in enumerate(geometry.groups)
    ]
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=retention_interval,
    )
