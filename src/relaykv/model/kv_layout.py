"""KV layout derived from a model config (docs/design.md §1).

The grouping (which layers share a group, where the EAGLE draft layer goes, page
balancing) is `relaykv.kvcache.group_layers`; this module adds what the runner needs:
* one block size for every group (a runner parameter, default 16);
* the draft layer's attention kind: full by default (like gpt-oss EAGLE3), a sliding draft
  joins the sliding group with its window; its group is marked `draft=True`;
* `bytes_per_token` of a group = layers * 2 (K and V) * kv_heads * head_dim * dtype size;
* each layer's slot (group, index in the group) and each group's page shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relaykv.kvcache.geometry import Geometry, GroupKey, GroupSpec, group_layers
from relaykv.model.config import ModelConfig

# Target layer i is keyed by i, the EAGLE draft layer by "draft".
LayerKey = int | str
DRAFT_LAYER: LayerKey = "draft"


@dataclass(frozen=True, slots=True)
class KVSlot:
    """Where one attention layer's KV lives: group index and layer index in the group."""

    group: int
    index: int


@dataclass(frozen=True, slots=True)
class DraftAttention:
    """The attention shape of the EAGLE draft layer (what the geometry needs of it)."""

    num_kv_heads: int
    head_dim: int
    window: int | None = None  # None: full attention (the default)


@dataclass(frozen=True, slots=True)
class GroupShape:
    kind: str
    window: int | None
    num_kv_heads: int
    head_dim: int
    num_layers: int


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Geometry plus the layer -> (group, index) map and page shapes of each group."""

    geometry: Geometry
    shapes: tuple[GroupShape, ...]
    layer_slots: tuple[KVSlot, ...]
    draft_slot: KVSlot | None
    dtype: torch.dtype

    @property
    def block_size(self) -> int:
        return self.geometry.groups[0].block_size

    def page_shape(self, group: int) -> tuple[int, ...]:
        """Shape of one page of a group: [layers, 2, block_size, kv_heads, head_dim]."""
        s = self.shapes[group]
        return (s.num_layers, 2, self.geometry.groups[group].block_size, s.num_kv_heads, s.head_dim)

    def page_bytes(self, group: int) -> int:
        return self.geometry.groups[group].page_bytes

    def slots(self) -> dict[LayerKey, KVSlot]:
        """Layer key -> (group, index in group), for the forward contexts."""
        out: dict[LayerKey, KVSlot] = dict(enumerate(self.layer_slots))
        if self.draft_slot is not None:
            out[DRAFT_LAYER] = self.draft_slot
        return out


def derive_layout(
    config: ModelConfig,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    draft: DraftAttention | None = None,
) -> KVLayout:
    """The KV layout of a model (and its draft layer, if any); see the module rules."""
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    keys: list[GroupKey] = []
    for layer in range(config.num_layers):
        window = config.window_of(layer)
        keys.append(("sliding" if window else "full", window, config.num_kv_heads, config.head_dim))
    draft_key: GroupKey | None = None
    if draft is not None:
        draft_key = (
            "sliding" if draft.window else "full",
            draft.window,
            draft.num_kv_heads,
            draft.head_dim,
        )
    groups = group_layers(keys, draft_key)
    slots: dict[int, KVSlot] = {}
    draft_slot = None
    for i, group in enumerate(groups):
        slots.update((layer, KVSlot(i, index)) for index, layer in enumerate(group.layers))
        if group.draft:
            draft_slot = KVSlot(i, len(group.layers))
    elem = torch.empty((), dtype=dtype).element_size()
    specs, shapes = [], []
    for group in groups:
        kind, window, kvh, hd = group.key
        specs.append(
            GroupSpec(
                kind,
                block_size,
                window=window,
                draft=group.draft,
                num_layers=group.num_layers,
                bytes_per_token=group.num_layers * 2 * kvh * hd * elem,
            )
        )
        shapes.append(GroupShape(kind, window, kvh, hd, group.num_layers))
    geometry = Geometry(tuple(specs), eagle=draft is not None)
    layer_slots = tuple(slots[layer] for layer in range(config.num_layers))
    return KVLayout(geometry, tuple(shapes), layer_slots, draft_slot, dtype)


def geometry_from_config(
    config: ModelConfig,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    draft: DraftAttention | None = None,
) -> Geometry:
    """The `relaykv.kvcache.Geometry` of a model (see `derive_layout`)."""
    return derive_layout(config, block_size, dtype, draft).geometry
