"""KV geometry derived from a model config (docs/design.md §1).

Rules:
* layers with the same attention kind, window and head shape share one group (one block
  table serves all of them); full groups come first, then sliding groups in the order
  their first layer appears;
* one block size for every group (a runner parameter, default 16);
* the EAGLE draft layer joins the group of its own attention kind (full by default, like
  gpt-oss EAGLE3; a sliding draft joins the sliding group with its window) as that
  group's last layer, and that group is marked `draft=True`. If no target group matches
  (e.g. a full draft on Mistral, where every layer slides) the draft gets its own group;
* `bytes_per_token` of a group = layers * 2 (K and V) * kv_heads * head_dim * dtype size;
* page balancing (as vLLM does): every block of the one pool is as large as the largest
  group's page, so a kind with many more layers than another (Gemma-3: 15 sliding, 3 full)
  would waste most of each small-group block. A kind is split into interleaved groups of at
  most `per_group` layers, `per_group` being the smallest kind's layer count (or the largest,
  when the largest is under 1.5x the smallest: splitting would only add groups).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relaykv.kvcache.geometry import Geometry, GroupSpec
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
    keys: list[tuple[str, int | None, int, int]] = []
    for layer in range(config.num_layers):
        window = config.window_of(layer)
        keys.append(("sliding" if window else "full", window, config.num_kv_heads, config.head_dim))
    draft_key = None
    if draft is not None:
        draft_key = (
            "sliding" if draft.window else "full",
            draft.window,
            draft.num_kv_heads,
            draft.head_dim,
        )
    distinct = list(dict.fromkeys(keys + ([draft_key] if draft_key else [])))
    ordered = [k for k in distinct if k[0] == "full"] + [k for k in distinct if k[0] == "sliding"]
    per_group = _layers_per_group([keys.count(k) for k in ordered if keys.count(k)])
    # Each kind becomes ceil(count / per_group) groups; its i-th layer goes to group i % n.
    first_group: dict[tuple[str, int | None, int, int], int] = {}
    splits: dict[tuple[str, int | None, int, int], int] = {}
    for key in ordered:
        first_group[key] = sum(splits.values())
        splits[key] = max(1, -(-keys.count(key) // per_group))
    seen = dict.fromkeys(ordered, 0)
    members: list[int] = [0] * sum(splits.values())
    layer_slots = []
    for key in keys:
        group = first_group[key] + seen[key] % splits[key]
        seen[key] += 1
        layer_slots.append(KVSlot(group, members[group]))
        members[group] += 1
    draft_slot = None
    if draft_key is not None:
        draft_slot = KVSlot(first_group[draft_key], members[first_group[draft_key]])
        members[first_group[draft_key]] += 1
    elem = torch.empty((), dtype=dtype).element_size()
    specs, shapes = [], []
    for key in ordered:
        kind, window, kvh, hd = key
        for i in range(first_group[key], first_group[key] + splits[key]):
            layers = members[i]
            specs.append(
                GroupSpec(
                    kind,
                    block_size,
                    window=window,
                    draft=draft_slot is not None and draft_slot.group == i,
                    num_layers=layers,
                    bytes_per_token=layers * 2 * kvh * hd * elem,
                )
            )
            shapes.append(GroupShape(kind, window, kvh, hd, layers))
    geometry = Geometry(tuple(specs), eagle=draft is not None)
    return KVLayout(geometry, tuple(shapes), tuple(layer_slots), draft_slot, dtype)


def _layers_per_group(counts: list[int]) -> int:
    """Layers per group for the page balancing rule of the module docstring."""
    if not counts:
        return 1
    smallest, largest = min(counts), max(counts)
    return largest if largest < 1.5 * smallest else smallest


def geometry_from_config(
    config: ModelConfig,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    draft: DraftAttention | None = None,
) -> Geometry:
    """The `relaykv.kvcache.Geometry` of a model (see `derive_layout`)."""
    return derive_layout(config, block_size, dtype, draft).geometry
