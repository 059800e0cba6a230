"""KV cache geometry: groups, block sizes, windows, the draft flag (docs/design.md §1).

A geometry is everything the cache needs to know about a model: which KV groups exist,
their kind (`full`, `sliding(W)` or `chunked(C)`), their block size, and whether a group holds the
layers of an EAGLE-style draft model. The derived constants `alignment` (lcm of block
sizes, the hit alignment A) and `hash_unit` (gcd, u) follow from it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

# kind -> the GroupSpec field holding its size parameter, and its letter in `describe()`.
# What a kind MEANS (which blocks matter) lives in `relaykv.kvcache.groups`, one file per kind.
KIND_PARAMETER: dict[str, tuple[str, str] | None] = {
    "full": None,
    "sliding": ("window", "W"),
    "chunked": ("chunk", "C"),
}
EagleReuse = Literal["drop", "successor", "recompute"]
EAGLE_REUSE_MODES: tuple[str, ...] = ("drop", "successor", "recompute")
# The modes that need nothing of the model runner: `recompute` needs one that copies pages
# and computes a hit's last position again (relaykv's own; not vLLM's, not the cache probe).
EAGLE_REUSE_CACHE_ONLY: tuple[str, ...] = ("drop", "successor")
# The modes relaykv's own engine runs (`successor` is a cache experiment of `relaykv
# cache-probe` and the vLLM plugin).
EAGLE_REUSE_ENGINE: tuple[str, ...] = ("drop", "recompute")


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative integers."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One KV group: layers of the same kind and block size sharing one block table.

    `window` is a sliding group's W, `chunk` a chunked-local group's C (a full group has
    neither). `bytes_per_token` is the KV bytes one token occupies across all layers of the
    group (K and V); it only matters for memory sizing, so cache-only tools may leave it 0.
    """

    kind: str  # a key of KIND_PARAMETER: full, sliding or chunked
    block_size: int
    window: int | None = None
    draft: bool = False
    num_layers: int = 1
    bytes_per_token: int = 0
    chunk: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KIND_PARAMETER:
            raise ValueError(
                f"unknown group kind {self.kind!r} (expected {' or '.join(KIND_PARAMETER)})"
            )
        if self.block_size < 1:
            raise ValueError(f"block size must be >= 1, got {self.block_size}")
        own = KIND_PARAMETER[self.kind]
        for param in KIND_PARAMETER.values():
            if param is None:
                continue
            value = getattr(self, param[0])
            if param is own and (value is None or value < 1):
                raise ValueError(f"a {self.kind} group needs a {param[0]} >= 1")
            if param is not own and value is not None:
                raise ValueError(f"a {self.kind} group has no {param[0]}")
        if self.num_layers < 0 or self.bytes_per_token < 0:
            raise ValueError("num_layers and bytes_per_token must be >= 0")

    @property
    def parameter(self) -> int | None:
        """The kind's size parameter (W, C), None for a full group."""
        own = KIND_PARAMETER[self.kind]
        return None if own is None else getattr(self, own[0])

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of this group (all its layers)."""
        return self.block_size * self.bytes_per_token

    def describe(self) -> str:
        own = KIND_PARAMETER[self.kind]
        extra = "" if own is None else f", {own[1]}={self.parameter}"
        return f"{self.kind}(b={self.block_size}{extra})" + (" [draft]" if self.draft else "")


@dataclass(frozen=True, slots=True)
class Geometry:
    """The groups of a model's KV cache plus the speculative-decoding settings.

    `eagle` turns on the EAGLE rules of docs/design.md §4. It is implied by any draft group;
    if it is set and no group is marked draft, every group counts as marked (§4).
    """

    groups: tuple[GroupSpec, ...]
    eagle: bool = False
    eagle_reuse: EagleReuse = "drop"
    alignment: int = field(init=False)
    hash_unit: int = field(init=False)
    draft_groups: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a geometry needs at least one group")
        if self.eagle_reuse not in EAGLE_REUSE_MODES:
            raise ValueError(
                f"eagle_reuse must be one of {', '.join(EAGLE_REUSE_MODES)}, "
                f"got {self.eagle_reuse!r}"
            )
        sizes = [g.block_size for g in self.groups]
        object.__setattr__(self, "groups", tuple(self.groups))
        object.__setattr__(self, "alignment", math.lcm(*sizes))
        object.__setattr__(self, "hash_unit", math.gcd(*sizes))
        marked = tuple(i for i, g in enumerate(self.groups) if g.draft)
        eagle = self.eagle or bool(marked)
        object.__setattr__(self, "eagle", eagle)
        if eagle and not marked:
            marked = tuple(range(len(self.groups)))
        object.__setattr__(self, "draft_groups", marked if eagle else ())

    # -- derived views ---------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def eagle_drop(self) -> bool:
        """True when draft groups must prove a reused boundary with a peek block (§4)."""
        return self.eagle and self.eagle_reuse == "drop"

    @property
    def eagle_successor(self) -> bool:
        return self.eagle and self.eagle_reuse == "successor"

    @property
    def eagle_recompute(self) -> bool:
        """True when a resume at r > 0 computes position r-1 again, into private copies of
        the blocks holding it (§4 `eagle_reuse=recompute`)."""
        return self.eagle and self.eagle_reuse == "recompute"

    def is_draft(self, group: int) -> bool:
        return group in self.draft_groups

    @property
    def block_bytes(self) -> int:
        """Bytes of one pool block: the largest group page (groups share one pool)."""
        return max(g.page_bytes for g in self.groups)

    def with_draft(self, index: int | None) -> Geometry:
        """The same geometry with the draft mark moved to group `index` (None: no draft)."""
        if index is not None and not 0 <= index < len(self.groups):
            raise ValueError(f"draft group index {index} out of range 0..{len(self.groups) - 1}")
        groups = tuple(replace(g, draft=(i == index)) for i, g in enumerate(self.groups))
        return Geometry(groups, eagle=index is not None, eagle_reuse=self.eagle_reuse)

    def with_eagle_reuse(self, mode: EagleReuse) -> Geometry:
        return Geometry(self.groups, eagle=self.eagle, eagle_reuse=mode)

    def describe(self) -> str:
        parts = ", ".join(f"g{i}={g.describe()}" for i, g in enumerate(self.groups))
        eagle = f"eagle={self.eagle_reuse}" if self.eagle else "eagle=off"
        return f"{parts}; A={self.alignment}, u={self.hash_unit}, {eagle}"


# What lets two layers share a group: (kind, window, KV heads, head dim).
GroupKey = tuple[str, int | None, int, int]


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """One group of a model's layers: their key, the target layers it holds (by index, in
    order) and whether the EAGLE draft layer joins it as its last layer."""

    key: GroupKey
    layers: tuple[int, ...]
    draft: bool = False

    @property
    def num_layers(self) -> int:
        return len(self.layers) + self.draft


def group_layers(
    layer_keys: Sequence[GroupKey], draft_key: GroupKey | None = None
) -> tuple[LayerGroup, ...]:
    """A model's layers -> its KV groups (the model's layout and the simulator both use this).

    * layers with the same key share a group; full groups come first, then the other kinds
      in the order their first layer appears;
    * the EAGLE draft layer joins the first group of its own key as that group's last layer;
      with no target layer of its key (a full draft on Mistral) it gets a group of its own;
    * page balancing (as vLLM does): every block of the one pool is as large as the largest
      group's page, so a kind with many more layers than another (Gemma-3: 15 sliding,
      3 full) would waste most of each small-group block. A kind is split into
      `cdiv(layers, per_group)` interleaved groups (its i-th layer goes to group i % n),
      `per_group` being the smallest kind's layer count, or the largest kind's when that
      is under 1.5x the smallest (splitting would only add groups).
    """
    kinds = list(dict.fromkeys([*layer_keys, *([draft_key] if draft_key else [])]))
    ordered = [k for k in kinds if k[0] == "full"] + [k for k in kinds if k[0] != "full"]
    members: dict[GroupKey, list[int]] = {k: [] for k in ordered}
    for layer, key in enumerate(layer_keys):
        members[key].append(layer)
    per_group = _layers_per_group([len(m) for m in members.values() if m])
    groups: list[LayerGroup] = []
    for key in ordered:
        splits = max(1, cdiv(len(members[key]), per_group))
        for i in range(splits):
            draft = key == draft_key and i == 0
            groups.append(LayerGroup(key, tuple(members[key][i::splits]), draft))
    return tuple(groups)


def _layers_per_group(counts: Sequence[int]) -> int:
    """The page-balancing rule of `group_layers`: the most layers one group holds, given
    each kind's layer count."""
    if not counts:
        return 1
    smallest, largest = min(counts), max(counts)
    return largest if largest < 1.5 * smallest else smallest


def parse_groups(text: str) -> tuple[GroupSpec, ...]:
    """Parse `full:16,sliding:16:128,chunked:16:8192` into group specs (`--groups`)."""
    groups: list[GroupSpec] = []
    for item in text.split(","):
        fields = item.strip().split(":")
        try:
            if fields[0] not in KIND_PARAMETER:
                raise ValueError
            param = KIND_PARAMETER[fields[0]]
            if len(fields) != (2 if param is None else 3):
                raise ValueError
            size: dict[str, int | None] = {"window": None, "chunk": None}
            if param is not None:
                size[param[0]] = int(fields[2])
            groups.append(
                GroupSpec(fields[0], int(fields[1]), window=size["window"], chunk=size["chunk"])
            )
        except ValueError as exc:
            raise ValueError(f"bad group {item.strip()!r}: expected {GROUP_SYNTAX}") from exc
    return tuple(groups)


GROUP_SYNTAX = "full:BLOCK or sliding:BLOCK:WINDOW or chunked:BLOCK:CHUNK"


def _gpt_oss_like() -> Geometry:
    # Alternating full and sliding(W=128) layers, one block size; the EAGLE3 draft layer is
    # a full-attention layer, so it joins the full group (docs/design.md §1).
    return Geometry(
        (
            GroupSpec("full", 16, draft=True, num_layers=12),
            GroupSpec("sliding", 16, window=128, num_layers=12),
        )
    )


def _gemma3_like() -> Geometry:
    # 5 sliding(W=512) : 1 full; no draft model by default.
    return Geometry(
        (
            GroupSpec("full", 16, num_layers=3),
            GroupSpec("sliding", 16, window=512, num_layers=15),
        )
    )


def _dsv4_like() -> Geometry:
    # One large-block full (compressed) group and sliding groups with different block sizes,
    # so A = 256 is much larger than the hash unit u = 4; the MTP/EAGLE draft lives in a
    # sliding group.
    return Geometry(
        (
            GroupSpec("full", 256),
            GroupSpec("sliding", 64, window=512, draft=True),
            GroupSpec("sliding", 8, window=128),
            GroupSpec("sliding", 4, window=8),
        )
    )


PRESETS = {
    "gpt-oss-like": _gpt_oss_like,
    "gemma3-like": _gemma3_like,
    "dsv4-like": _dsv4_like,
}


def preset(name: str) -> Geometry:
    """A named preset geometry (`gpt-oss-like`, `gemma3-like`, `dsv4-like`)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
