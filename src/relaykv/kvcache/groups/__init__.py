"""Per-kind group rules; `rules_for(geometry)` builds one object per group."""

from __future__ import annotations

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.groups.base import GroupRules
from relaykv.kvcache.groups.full import FullAttentionGroup
from relaykv.kvcache.groups.sliding import SlidingWindowGroup


def rules_for(geometry: Geometry) -> tuple[GroupRules, ...]:
    return tuple(
        FullAttentionGroup(geometry, i) if g.kind == "full" else SlidingWindowGroup(geometry, i)
        for i, g in enumerate(geometry.groups)
    )


__all__ = ["FullAttentionGroup", "GroupRules", "SlidingWindowGroup", "rules_for"]
