"""Sliding-window groups: position p attends to `[max(0, p-W+1), p]` (KVCACHE.md §1)."""

from __future__ import annotations

from collections.abc import Container, Sequence

from relaykv.kvcache.groups.base import GroupRules


class SlidingWindowGroup(GroupRules):
    """Needs the window below r (+ peek); frees blocks that fall out of the window (§6)."""

    __slots__ = ("_successor", "window")

    def __init__(self, geometry, index: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(geometry, index)
        assert self.spec.window is not None
        self.window = self.spec.window
        self._successor = self.draft and geometry.eagle_successor

    @property
    def successor_keys(self) -> bool:
        return self._successor

    def window_start_block(self, position: int) -> int:
        """First block holding a token that `position` attends to."""
        return max(0, position - self.window + 1) // self.block_size

    def needed(self, r: int) -> range:
        # Resuming at r computes position r, which reads [r-W+1, r): the blocks
        # [floor(max(0, r-W+1)/b), r/b), plus the peek block r/b for a draft group.
        if r <= 0:
            return range(0)
        return range(self.window_start_block(r), r // self.block_size + self.peek)

    def longest_hit(self, keys: Sequence[bytes], cached: Container[bytes], cap: int) -> int:
        # Candidates from the right, as in §5. When block m misses, no candidate whose
        # needed range contains m can hit, and those below have needed.stop <= m, so the
        # scan jumps to the highest aligned r with r/b + peek <= m. Each block is probed at
        # most once, so a cold 64k-token prompt costs one dict probe per block.
        b, a, peek = self.block_size, self.alignment, self.peek
        r = self.align_down(cap)
        while r > 0:
            need = self.needed(r)
            if need.stop > len(keys):
                r = self.align_down(min(r - a, (len(keys) - peek) * b))
                continue
            miss = -1
            for i in range(need.stop - 1, need.start - 1, -1):
                if keys[i] not in cached:
                    miss = i
                    break
            if miss < 0:
                return r
            r = self.align_down(min(r - a, (miss - peek) * b))
        return 0

    def first_kept_block(self, processed: int, floor_token: int | None = None) -> int:
        # After `processed` tokens the next position reads [processed-W+1, processed]; blocks
        # wholly below are dead for this request (§6). A retention floor keeps more.
        threshold = processed - self.window + 1
        if floor_token is not None:
            threshold = min(threshold, floor_token)
        return max(0, threshold) // self.block_size
