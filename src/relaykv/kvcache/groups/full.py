"""Full-attention groups: a position attends to every earlier position (KVCACHE.md §1)."""

from __future__ import annotations

from collections.abc import Container, Sequence
from itertools import islice, takewhile

from relaykv.kvcache.groups.base import GroupRules


class FullAttentionGroup(GroupRules):
    """Needs blocks `[0, r/b)` (+ the peek block for a draft group); never frees early."""

    __slots__ = ("_successor",)

    def __init__(self, geometry, index: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(geometry, index)
        self._successor = self.draft and geometry.eagle_successor

    @property
    def successor_keys(self) -> bool:
        return self._successor

    def needed(self, r: int) -> range:
        return range(0, r // self.block_size + self.peek)

    def matched_blocks(self, keys: Sequence[bytes], cached: Container[bytes], limit: int) -> int:
        """Length of the run of cached keys from block 0 (chained hashes make it a prefix)."""
        # takewhile over the bound `__contains__` runs the walk in C (a router scores every
        # engine with this; a 64k-token prompt is 4,096 probes).
        limit = min(limit, len(keys))
        return len(list(takewhile(cached.__contains__, islice(keys, limit))))

    def longest_hit(self, keys: Sequence[bytes], cached: Container[bytes], cap: int) -> int:
        matched = self.matched_blocks(keys, cached, cap // self.block_size + self.peek)
        return self.hit_from_matched(matched, cap)

    def hit_from_matched(self, matched: int, cap: int) -> int:
        """The aligned resume point a run of `matched` cached blocks supports, capped."""
        usable = matched - self.peek
        if usable <= 0:
            return 0
        return self.align_down(min(cap, usable * self.block_size))

    def first_kept_block(self, processed: int, floor_token: int | None = None) -> int:
        return 0
