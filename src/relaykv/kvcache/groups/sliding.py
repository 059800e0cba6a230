"""Sliding-window groups: position p attends to `[max(0, p-W+1), p]` (docs/design.md §1)."""

from __future__ import annotations

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.groups.base import GroupRules


class SlidingWindowGroup(GroupRules):
    """Needs the window below r (+ peek); frees blocks that fall out of the window (§6)."""

    KIND = "sliding"
    __slots__ = ("window",)

    def __init__(self, geometry: Geometry, index: int) -> None:
        super().__init__(geometry, index)
        assert self.spec.window is not None
        self.window: int = self.spec.window

    @property
    def reach(self) -> int:
        return self.window

    def first_read_block(self, position: int) -> int:
        return max(0, position - self.window + 1) // self.block_size

    # Closed forms of the generic derivations (hot paths; the contract tests check them).
    def hit_cap_for_floor(self, first_block: int) -> int:
        # max(0, r-t-W+1)//b <= f  <=>  r <= (f+1)*b + W - 2 + t  (t: the recompute tail)
        return (first_block + 1) * self.block_size + self.window - 2 + self.tail

    def slack_tokens(self, processed: int, first_block: int) -> int:
        # max(0, p-s-W+1)//b <= f  <=>  s >= p - W + 2 - (f+1)*b
        return max(0, processed - self.window + 2 - (first_block + 1) * self.block_size)
