"""relaykv.kvcache: the hybrid KV cache contract (design/KVCACHE.md). Never imports torch."""

from __future__ import annotations

from relaykv.kvcache.geometry import (
    PRESETS,
    Geometry,
    GroupSpec,
    cdiv,
    parse_groups,
    preset,
)

__all__ = ["PRESETS", "Geometry", "GroupSpec", "cdiv", "parse_groups", "preset"]
