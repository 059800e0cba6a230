"""Per-kind group rules; `rules_for(geometry)` builds one object per group.

`KINDS` maps a `GroupSpec.kind` to its rules class; a new kind is one file here plus its
entry (docs/design.md §1).
"""

from __future__ import annotations

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.groups.base import GroupRules
from relaykv.kvcache.groups.chunked import ChunkedLocalGroup
from relaykv.kvcache.groups.full import FullAttentionGroup
from relaykv.kvcache.groups.sliding import SlidingWindowGroup

KINDS: dict[str, type[GroupRules]] = {
    cls.KIND: cls for cls in (FullAttentionGroup, SlidingWindowGroup, ChunkedLocalGroup)
}


def rules_for(geometry: Geometry) -> tuple[GroupRules, ...]:
    return tuple(KINDS[g.kind](geometry, i) for i, g in enumerate(geometry.groups))


__all__ = [
    "KINDS",
    "ChunkedLocalGroup",
    "FullAttentionGroup",
    "GroupRules",
    "SlidingWindowGroup",
    "rules_for",
]
