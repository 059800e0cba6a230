"""What the tier stores for each group, derived from `GroupRules` (docs/tier.md "Plan").

The tier keeps checkpoints: resume points r at which a later request can continue. The
offload boundaries of a request are the multiples of the interval K (`--kv-offloading-interval`,
a multiple of the alignment A; default the retention interval, else A) plus the request's own
replay boundaries and junction (the points its device retention keeps, §6), so an identical
resend lands on a checkpoint whatever K is.

A checkpoint at r with parent checkpoint p (the previous one of the same sequence, 0 for none)
stores, per group:

| group kind        | blocks of the checkpoint                                   |
|-------------------|------------------------------------------------------------|
| full              | `needed(p).stop .. needed(r).stop`: what the parent lacks  |
| sliding, chunked  | `needed(r)`: the window (and EAGLE peek) at r              |

so the chain of checkpoints from the root to r holds every block every group needs to resume
at r: each node is a complete resume point (`TierIndex.check` verifies it). A checkpoint can
be stored once every block it names is written: `ready_at(r)` tokens processed (the EAGLE
peek block included) and keyed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.retention import Retention

INTERVAL_FLAG = "--kv-offloading-interval"


def parse_interval(value: int | None, alignment: int, retention: Retention | None = None) -> int:
    """The checkpoint interval K: `value`, or the retention interval, or the alignment A."""
    if value is None:
        if retention is not None and retention.kind == "interval":
            return retention.interval
        return alignment
    if value <= 0 or value % alignment:
        raise ValueError(
            f"{INTERVAL_FLAG} must be a positive multiple of the alignment {alignment}, got {value}"
        )
    return value


class TierPlan:
    """The checkpoints of one geometry: where they sit and which blocks each holds."""

    __slots__ = ("alignment", "interval", "rules")

    def __init__(self, rules: tuple[GroupRules, ...], interval: int | None = None) -> None:
        self.rules = rules
        self.alignment = rules[0].alignment
        self.interval = parse_interval(interval, self.alignment)

    def points(self, after: int, upto: int, extra: Iterable[int] = ()) -> list[int]:
        """Offload boundaries r with `after < r <= upto`, ascending: multiples of the interval
        and the aligned points of `extra` (replay boundaries, a junction)."""
        k = self.interval
        found = set(range((after // k + 1) * k, upto + 1, k))
        a = self.alignment
        found.update(r for r in extra if after < r <= upto and r % a == 0)
        return sorted(found)

    def ready_at(self, r: int) -> int:
        """Tokens that must be processed before every block of checkpoint r is written."""
        return max(rule.needed(r).stop * rule.block_size for rule in self.rules)

    def blocks(self, r: int, parent: int) -> list[range]:
        """Per group, the block indices checkpoint r stores under a parent checkpoint at
        `parent` (0: a root)."""
        out = []
        for rule in self.rules:
            need = rule.needed(r)
            if rule.prefix_closed:
                out.append(range(rule.needed(parent).stop, need.stop))
            else:
                out.append(need)
        return out

    def covered(self, r: int) -> list[range]:
        """Per group, the blocks a resume at r needs: what the chain up to r must hold."""
        return [rule.needed(r) for rule in self.rules]

    def items(
        self, keys: Sequence[Sequence[bytes]], r: int, parent: int
    ) -> list[list[tuple[int, bytes]]] | None:
        """Per group, the `(block index, key)` pairs of checkpoint r under `parent`, from a
        sequence's block keys; None when a block it names is not keyed yet."""
        out = []
        for g, span in enumerate(self.blocks(r, parent)):
            if span.stop > len(keys[g]):
                return None
            out.append([(i, keys[g][i]) for i in span])
        return out

    def node_id(self, keys: Sequence[Sequence[bytes]], r: int) -> bytes:
        """The checkpoint's identity: r and the last needed key of every group (chained
        hashes: equal ids mean equal content of every block the checkpoint's chain holds)."""
        parts = [r.to_bytes(8, "little")]
        for g, need in enumerate(self.covered(r)):
            parts.append(keys[g][need.stop - 1] if len(need) else b"-")
        return b"".join(parts)
