"""Model shapes the simulator needs: parameter counts for compute, KV geometry for the cache.

No weights. A `ModelSpec` carries what the cost model reads (parameters touched per token,
weight bytes, attention shape per layer kind) and the exact KV `Geometry` the real engine
would build, grouped by the engine's rule, `relaykv.kvcache.group_layers` (docs/simulator.md
"Models"): layers of one (kind, window, KV heads, head dim) share a group, full groups
first, block size 16, the EAGLE draft layer joins the group of its own kind, and a kind
with >= 1.5x the layers of the smallest is split into interleaved groups (page balancing).
The presets are in `relaykv.sim.model_presets`; any HF `config.json` goes through
`relaykv.sim.model_presets.from_hf_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relaykv.kvcache import Geometry, GroupSpec, group_layers


@dataclass(frozen=True, slots=True)
class LayerKind:
    """One attention kind of the model: how many layers, their window, their shape.

    `kv_bytes_per_token` is one layer's K+V bytes per token (as stored in the cache);
    `compression`: tokens per attended KV entry (1 for plain attention; a compressed
    full-context group attends to `ctx / compression` entries).
    """

    kind: str  # full | sliding
    window: int | None
    num_layers: int
    num_q_heads: int
    head_dim: int
    num_kv_heads: int
    kv_bytes_per_token: int
    compression: int = 1

    @property
    def key(self) -> tuple[str, int | None, int, int]:
        return (self.kind, self.window, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the cost model and the cache need to know about a model (docs/simulator.md).

    * `total_params` / `active_params`: parameters stored / touched per token (MoE);
    * `num_experts`, `experts_per_token`: 0 / 0 for a dense model;
    * `dense_weight_bytes`, `expert_weight_bytes`: bytes per parameter of the non-expert and
      expert weights (bf16 = 2, MXFP4 ~ 0.53);
    * `layers`: the attention kinds (target model only); `draft`: the EAGLE draft layer's
      kind (None: no draft), counted in the KV geometry and, per proposal, in the cost;
    * `draft_params`: parameters of the draft model run once per proposed token;
    * `hidden_size`: the width of the all-reduced activations under tensor parallelism;
    * `geometry_override`: an explicit geometry (dsv4-flash), else derived from `layers`.
    """

    name: str
    total_params: float
    active_params: float
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerKind, ...]
    num_experts: int = 0
    experts_per_token: int = 0
    dense_weight_bytes: float = 2.0
    expert_weight_bytes: float = 2.0
    draft: LayerKind | None = None
    draft_params: float = 0.0
    block_size: int = 16
    geometry_override: Geometry | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def num_layers(self) -> int:
        return sum(k.num_layers for k in self.layers)

    @property
    def expert_params(self) -> float:
        """Parameters held in experts: total - active = experts * (1 - k/E)."""
        if not self.num_experts:
            return 0.0
        share = self.experts_per_token / self.num_experts
        return (self.total_params - self.active_params) / (1.0 - share)

    @property
    def dense_params(self) -> float:
        return self.total_params - self.expert_params

    def weight_bytes(self, tokens_in_step: int) -> float:
        """Weight bytes a step reads: dense weights, plus the experts its tokens touch.

        With B tokens each routed to k of E experts independently and uniformly, an
        expert is touched with probability 1 - (1 - k/E)^B (docs/simulator.md "Decode").
        """
        dense = self.dense_params * self.dense_weight_bytes
        if not self.num_experts:
            return dense
        touched = 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** max(1, tokens_in_step)
        return dense + self.expert_params * touched * self.expert_weight_bytes

    def geometry(self, with_draft: bool) -> Geometry:
        if self.geometry_override is not None:
            if with_draft:
                return self.geometry_override
            groups = tuple(
                GroupSpec(g.kind, g.block_size, g.window, False, g.num_layers, g.bytes_per_token)
                for g in self.geometry_override.groups
            )
            return Geometry(groups)
        return derive_geometry(self.layers, self.draft if with_draft else None, self.block_size)


def derive_geometry(
    layers: tuple[LayerKind, ...], draft: LayerKind | None, block_size: int
) -> Geometry:
    """The engine's geometry for these layer kinds (the rule of the module docstring)."""
    per_layer = {kind.key: kind.kv_bytes_per_token for kind in layers}
    if draft is not None:
        per_layer.setdefault(draft.key, draft.kv_bytes_per_token)
    keys = [kind.key for kind in layers for _ in range(kind.num_layers)]
    specs = tuple(
        GroupSpec(
            group.key[0],
            block_size,
            window=group.key[1],
            draft=group.draft,
            num_layers=group.num_layers,
            bytes_per_token=group.num_layers * per_layer[group.key],
        )
        for group in group_layers(keys, draft.key if draft else None)
    )
    return Geometry(specs, eagle=draft is not None)
