"""Replay boundaries and the sliding-window retention policies (docs/design.md §6).

Full groups hash every full block. A sliding group hashes only the windows a later lookup
can land on; which ones is the retention policy:

| policy       | sliding blocks that get a hash                                            |
|--------------|---------------------------------------------------------------------------|
| `dense`      | every full block                                                          |
| `boundaries` | the windows (+ peek) of the replay boundaries and shared-prefix junctions |
| `interval:K` | `boundaries` plus the window at every multiple of K                       |

An engine's default is `auto`: `dense` on a prefill engine, `boundaries` elsewhere. A first
request cannot know where a later sibling will diverge from it, so under `boundaries` its
windows sit only at its own replay boundaries and the second sibling on a prefill engine
misses; a prefill engine serves nothing but prompts, so it keeps every window (§6).

Replay boundaries. §6 gives them as `floor((N-1)/A)*A` (identical resend) and `floor(N/A)*A`
(extension), each minus A under the EAGLE drop. We keep those AND the exact landing points
computed from the same predicate as the lookup (`needed(r)` of every group against the blocks
an N-token prompt can key). The two agree whenever draft groups have block size A, except that
an identical resend of a prompt whose length is a multiple of A proves its last block and lands
at N-A, not N-2A; with a draft group whose block size is below A the exact points are the only
correct ones. Keeping the union costs at most one extra window and never loses a hit.
"""

from __future__ import annotations

from dataclasses import dataclass

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.groups import GroupRules, rules_for
from relaykv.kvcache.pd_config import Role

RETENTION_HELP = "dense | boundaries | interval:K (K a multiple of the alignment)"
AUTO_RETENTION = "auto"
ENGINE_RETENTION_HELP = (
    f"{AUTO_RETENTION} (default: dense on a prefill engine, boundaries elsewhere) | "
    f"{RETENTION_HELP}"
)


@dataclass(frozen=True, slots=True)
class Retention:
    """A parsed retention policy (`interval` is 0 unless the policy is `interval:K`)."""

    kind: str  # "dense" | "boundaries" | "interval"
    interval: int = 0

    def __str__(self) -> str:
        return f"interval:{self.interval}" if self.kind == "interval" else self.kind


def default_retention(role: Role) -> str:
    """What `auto` means for an engine of `role` (docs/design.md §6)."""
    return "dense" if role is Role.PREFILL else "boundaries"


def parse_retention(text: str, alignment: int, role: Role | None = None) -> Retention:
    """Parse `--retention`; K must be a positive multiple of the alignment A. `auto` needs
    the engine's `role`."""
    if text == AUTO_RETENTION and role is not None:
        text = default_retention(role)
    if text in ("dense", "boundaries"):
        return Retention(text)
    if text.startswith("interval:"):
        try:
            k = int(text.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"bad retention {text!r}: expected {RETENTION_HELP}") from None
        if k <= 0 or k % alignment:
            raise ValueError(
                f"bad retention {text!r}: K must be a positive multiple "
                f"of the alignment {alignment}"
            )
        return Retention("interval", k)
    raise ValueError(f"bad retention {text!r}: expected {RETENTION_HELP}")


def landing_point(geometry: Geometry, rules: tuple[GroupRules, ...], n: int, cap: int) -> int:
    """Largest aligned r <= cap whose needs an n-token cached prompt can meet in every group."""
    limit = cap
    for rule in rules:
        # needed(r) must lie within the keyable blocks of the prompt.
        limit = min(limit, rule.last_point_within(rule.keyable_blocks(n)))
    a = geometry.alignment
    return max(0, limit) // a * a


def replay_boundaries(
    geometry: Geometry, n: int, rules: tuple[GroupRules, ...] | None = None
) -> tuple[int, ...]:
    """Resume points later requests can land on after an n-token prompt (positive ones)."""
    rules = rules or rules_for(geometry)
    a = geometry.alignment
    formula = [(n - 1) // a * a, n // a * a]
    if geometry.eagle_drop:
        formula = [max(0, r - a) for r in formula]
    exact = [landing_point(geometry, rules, n, n - 1), landing_point(geometry, rules, n, n)]
    return tuple(sorted({r for r in formula + exact if r > 0}))


def reachable_points(
    retention: Retention, boundaries: tuple[int, ...], junction: int, upto: int
) -> list[int]:
    """Resume points whose sliding windows a request keeps under `retention` (not dense)."""
    points = set(boundaries)
    if junction > 0:
        points.add(junction)
    if retention.kind == "interval":
        points.update(range(retention.interval, upto + 1, retention.interval))
    return sorted(p for p in points if 0 < p <= upto)


def hash_mask(
    rule: GroupRules, retention: Retention, boundaries: tuple[int, ...], junction: int, upto: int
) -> set[int] | None:
    """Block indices of a group that get a hash; None means every full block."""
    if retention.kind == "dense" or rule.prefix_closed:
        return None
    return rule.retained_blocks(reachable_points(retention, boundaries, junction, upto))
