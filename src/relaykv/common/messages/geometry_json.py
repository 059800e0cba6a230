"""The cache geometry as `/v1/kv_cache_info` carries it: written by an engine, read by a router.

`{"groups": [{"kind", "block_size", "window", "chunk", "draft"}, ...], "eagle", "eagle_reuse"}`
(docs/routing.md). An engine writes its `kvcache.Geometry` with `geometry_json`; a router
rebuilds one with `parse_geometry_json(raw, GroupSpec, Geometry)`. The floor does not import
kvcache (it sits below it), so it reads the geometry through the attributes named here and
is handed kvcache's two constructors to build one; kvcache's own checks (a known kind, a
window for a sliding group, ...) still decide what a valid geometry is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar


class GroupFields(Protocol):
    """What the JSON holds of one KV group (`kvcache.GroupSpec` has these)."""

    @property
    def kind(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def window(self) -> int | None: ...
    @property
    def chunk(self) -> int | None: ...
    @property
    def draft(self) -> bool: ...


class GeometryFields(Protocol):
    """What the JSON holds of a geometry (`kvcache.Geometry` has these)."""

    @property
    def groups(self) -> Sequence[GroupFields]: ...
    @property
    def eagle(self) -> bool: ...
    @property
    def eagle_reuse(self) -> str: ...


G = TypeVar("G")
T = TypeVar("T")


def geometry_json(geometry: GeometryFields) -> dict[str, Any]:
    """The geometry as the JSON object an engine serves."""
    return {
        "groups": [
            {
                "kind": g.kind,
                "block_size": g.block_size,
                "window": g.window,
                "chunk": g.chunk,
                "draft": g.draft,
            }
            for g in geometry.groups
        ],
        "eagle": geometry.eagle,
        "eagle_reuse": geometry.eagle_reuse,
    }


def parse_geometry_json(
    raw: dict[str, Any], make_group: Callable[..., G], make_geometry: Callable[..., T]
) -> T:
    """A geometry from the JSON object: `make_group(kind, block_size, window, draft,
    chunk=...)` per group, then `make_geometry(groups, eagle=..., eagle_reuse=...)`.
    Raises ValueError when the object is malformed (or the constructors refuse it)."""
    try:
        groups = tuple(
            make_group(
                g["kind"],
                int(g["block_size"]),
                g.get("window"),
                bool(g.get("draft")),
                chunk=g.get("chunk"),
            )
            for g in raw["groups"]
        )
        return make_geometry(
            groups, eagle=bool(raw.get("eagle")), eagle_reuse=raw.get("eagle_reuse", "drop")
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed geometry: {exc}") from None
