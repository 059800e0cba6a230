"""The per-kind contract of a KV group (docs/design.md §4-§8).

A kind states ONE thing: which earlier positions a position attends to, as
`first_read_block(position)` (plus `reach`, how far back that can be at most). From it,
`needed(r)` follows: the blocks a computation resuming at `r` reads (positions below `r`
from the first read block on), plus the EAGLE peek block `r/b` for a draft group under
`eagle_reuse=drop`; under `eagle_reuse=recompute` a resume at r computes position r-1 again,
so it needs what r-1 reads instead, and no peek (§4). Every other question any component
asks about a group is a method here, derived from `needed` and checked against brute force
over `needed` by
tests/kvcache/test_group_contract.py for random geometries:

| method                         | question                                                  |
|--------------------------------|-----------------------------------------------------------|
| `needed(r)`                    | blocks to hold to resume at r (§4)                        |
| `longest_hit(keys, cached, c)` | largest aligned r <= c whose needed blocks are all cached (§5) |
| `first_kept_block(p, floor)`   | first block a request that processed p tokens still reads (§6) |
| `hit_cap_for_floor(f)`         | largest r whose needed blocks start at or below block f (§7) |
| `hash_horizon(upto)`           | resume points whose windows can reach below `upto` (§6)   |
| `retained_blocks(points)`      | blocks to keep hashed so the points stay reachable (§6)   |
| `last_point_within(blocks)`    | largest r whose needed blocks lie below index `blocks` (§5, §6) |
| `slack_tokens(p, f)`           | tokens a floor at block f holds below the standard window (§8) |
| `worst_case_blocks(...)`       | most blocks one running request holds (§8)                |

A new kind (a third attention pattern) is one file in this package: a subclass with `KIND`,
`reach` and `first_read_block`, registered in `groups/__init__.py`. The generic methods below
require only that `first_read_block` is non-decreasing and at most `position // b`, and that
a position reads nothing below `position - reach + 1`. Kinds may override a method with a
closed form for speed; the contract tests hold every kind to the brute-force answer.

The rules hold no request state; block tables live on the request and blocks in the pool.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Iterable, Sequence
from itertools import islice, takewhile
from typing import ClassVar

from relaykv.kvcache.geometry import Geometry, GroupSpec, cdiv


class GroupRules(ABC):
    KIND: ClassVar[str]

    __slots__ = (
        "alignment",
        "block_size",
        "draft",
        "index",
        "peek",
        "reuse_peek",
        "spec",
        "successor_keys",
        "tail",
    )

    def __init__(self, geometry: Geometry, index: int) -> None:
        self.index = index
        self.spec: GroupSpec = geometry.groups[index]
        self.block_size = self.spec.block_size
        self.alignment = geometry.alignment
        self.draft = geometry.is_draft(index)
        # Under the EAGLE drop a draft group must also hold the block starting at r (§4).
        self.peek = 1 if (self.draft and geometry.eagle_drop) else 0
        # Under `eagle_reuse=recompute` a resume at r > 0 computes position r-1 again, in every
        # group, into a private copy of the block holding it (§4): `needed(r)` is what r-1 reads.
        self.tail = 1 if geometry.eagle_recompute else 0
        # A block reused whole without computing its last position again (a decode engine's
        # per-block reuse after a load, §7, which computes only N-1) still needs the next
        # block to prove its draft KV, under the drop and under recompute alike.
        self.reuse_peek = 1 if (self.draft and (geometry.eagle_drop or self.tail)) else 0
        # Draft groups under `eagle_reuse=successor` key blocks by the next token too (§4).
        self.successor_keys = self.draft and geometry.eagle_successor

    # -- what the kind states -----------------------------------------------------------
    @property
    @abstractmethod
    def reach(self) -> int | None:
        """Most positions one position reads, itself included (None: all earlier ones)."""

    @abstractmethod
    def first_read_block(self, position: int) -> int:
        """First block holding a token that `position` attends to."""

    # -- derived: the contract -----------------------------------------------------------
    @property
    def prefix_closed(self) -> bool:
        """Every `needed(r)` starts at block 0: the group never drops leading blocks, and a
        hit at r implies a hit at every smaller aligned point (looked up in one pass, §5)."""
        return self.reach is None

    def needed(self, r: int) -> range:
        """Block indices a request resuming at `r` must hold (§4)."""
        if r <= 0:
            return range(0)
        return range(self.first_read_block(r - self.tail), r // self.block_size + self.peek)

    def longest_hit(self, keys: Sequence[bytes], cached: Container[bytes], cap: int) -> int:
        """Largest aligned resume point `<= cap` this group can serve (§5).

        Candidates from the right. When block m misses, no candidate whose needed range
        contains m can hit, and those below have needed.stop <= m (needed ranges are
        contiguous with non-decreasing ends), so the scan jumps to the highest aligned r with
        r/b + peek <= m. Each block is probed at most once.
        """
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

    def matched_blocks(self, keys: Sequence[bytes], cached: Container[bytes], limit: int) -> int:
        """Length of the run of cached keys from block 0 (chained hashes make it a prefix)."""
        # takewhile over the bound `__contains__` runs the walk in C (a router scores every
        # engine with this; a 64k-token prompt is 4,096 probes).
        limit = min(limit, len(keys))
        return len(list(takewhile(cached.__contains__, islice(keys, limit))))

    def hit_from_matched(self, matched: int, cap: int) -> int:
        """For a prefix-closed group: the aligned resume point a run of `matched` cached
        blocks from block 0 supports, capped."""
        if matched - self.peek <= 0:
            return 0
        return self.align_down(min(cap, self.last_point_within(matched)))

    def last_point_within(self, blocks: int) -> int:
        """Largest r >= 0 with `needed(r).stop <= blocks` (0 when there is none)."""
        return max(0, (blocks - self.peek + 1) * self.block_size - 1)

    def first_kept_block(self, processed: int, floor_token: int | None = None) -> int:
        """First block a request that processed `processed` tokens still reads (§6): the next
        position reads from `first_read_block(processed)` on, later ones from no lower. A
        retention floor (a token) keeps more. Monotone in `processed`."""
        first = self.first_read_block(processed) if processed > 0 else 0
        if floor_token is not None:
            first = min(first, max(0, floor_token) // self.block_size)
        return first

    def hit_cap_for_floor(self, first_block: int) -> int | None:
        """Largest r whose `needed(r)` starts at or below `first_block` (None: no limit).

        A prefill engine must end up holding its plan's blocks from `first_block` on; a local
        hit above this cap would leave nulls there (§7).
        """
        if self.reach is None:
            return None
        # first_read_block is non-decreasing; lo satisfies it, hi does not. needed(r) starts
        # at first_read_block(r - tail).
        lo = (first_block + 1) * self.block_size - 1
        hi = (first_block + 1) * self.block_size + self.reach - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.first_read_block(mid) <= first_block:
                lo = mid
            else:
                hi = mid
        return lo + self.tail

    def hash_horizon(self, upto: int) -> int | None:
        """A resume point beyond which no point's `needed` starts below block `upto // b`
        (None for a prefix-closed group: every later point reads block 0).

        Blocks are hashed once, when they fill, so a mask computed after `upto` tokens must
        already name the blocks of points a little beyond `upto` (chunked prefill, §6).
        """
        cap = self.hit_cap_for_floor(upto // self.block_size - 1)
        return None if cap is None else max(upto, cap)

    def retained_blocks(self, points: Iterable[int]) -> set[int] | None:
        """Blocks to hash so that each resume point in `points` stays reachable (§6); None
        for a prefix-closed group, whose every full block is needed by every later point."""
        if self.prefix_closed:
            return None
        mask: set[int] = set()
        for r in points:
            mask.update(self.needed(r))
        return mask

    def keyable_blocks(self, num_tokens: int) -> int:
        """Blocks of a `num_tokens`-token prompt that carry a key (§2; §4 successor keys)."""
        if self.successor_keys:
            return max(0, num_tokens - 1) // self.block_size
        return num_tokens // self.block_size

    def slack_tokens(self, processed: int, first_block: int) -> int:
        """Smallest s >= 0 with `first_kept_block(processed - s) <= first_block`: how far
        behind `processed` a retention floor at `first_block` holds the window (§8)."""
        if self.first_kept_block(processed) <= first_block:
            return 0
        lo, hi = 0, max(0, processed)  # first_kept_block(processed - hi) = 0 <= first_block
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.first_kept_block(processed - mid) <= first_block:
                hi = mid
            else:
                lo = mid
        return hi

    def worst_case_blocks(self, max_model_len: int, in_flight_tokens: int, slack: int) -> int:
        """Most blocks one running request holds (§8): after p processed tokens it keeps
        from `first_kept_block(p - slack)`, at most `reach - 1 + slack` tokens back, up to
        the last of `in_flight_tokens` scheduled ones; a span of t tokens touches at most
        `cdiv(t, b) + 1` blocks. Under `eagle_reuse=recompute` one more: the source of its
        private copy, held until its first step is committed (§4)."""
        whole = cdiv(max_model_len, self.block_size)
        if self.reach is None:
            return whole + self.tail
        span = min(self.reach - 1 + slack + in_flight_tokens, max_model_len)
        return min(cdiv(span, self.block_size) + 1, whole) + self.tail

    # -- helpers ----------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks covering positions `[0, num_tokens)`."""
        return -(-num_tokens // self.block_size)

    def align_down(self, tokens: int) -> int:
        return max(0, tokens) // self.alignment * self.alignment
