"""Full-attention groups: a position attends to every earlier position (docs/design.md §1)."""

from __future__ import annotations

from collections.abc import Container, Sequence

from relaykv.kvcache.groups.base import GroupRules


class FullAttentionGroup(GroupRules):
    """Needs blocks `[0, r/b)` (+ the peek block for a draft group); never frees early."""

    KIND = "full"
    __slots__ = ()

    @property
    def reach(self) -> None:
        return None

    def first_read_block(self, position: int) -> int:
        return 0

    def longest_hit(self, keys: Sequence[bytes], cached: Container[bytes], cap: int) -> int:
        # Prefix-closed: the longest cached run from block 0 decides (§5).
        matched = self.matched_blocks(keys, cached, cap // self.block_size + self.peek)
        return self.hit_from_matched(matched, cap)
