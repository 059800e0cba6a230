"""The per-kind rules of a KV group (KVCACHE.md §4-§6).

A `GroupRules` object answers, for one group of a geometry, the questions every component
asks: which block indices a resume point needs, the longest resume point this group can
serve from a cache, and which leading blocks a running request no longer reads. It holds no
request state; block tables live on the request and blocks in the pool.

Contract for implementations:
* `needed(r)` is exact: the blocks whose KV a computation resuming at `r` reads, plus the
  EAGLE peek block for a draft group under `eagle_reuse=drop` (§4). `r` is a multiple of the
  geometry's alignment.
* `longest_hit(keys, cached, cap)` returns the largest aligned `r <= cap` such that every
  index of `needed(r)` is below `len(keys)` and its key is in `cached`; 0 when none is. It
  must agree with a brute-force scan of `needed` (the oracle tests this).
* `first_kept_block(processed, floor_token)` is monotone in `processed`: blocks below it are
  never read again by the request (§6); `floor_token` lets a retention plan keep more.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Sequence

from relaykv.kvcache.geometry import Geometry, GroupSpec


class GroupRules(ABC):
    __slots__ = ("alignment", "block_size", "draft", "index", "peek", "spec")

    def __init__(self, geometry: Geometry, index: int) -> None:
        self.index = index
        self.spec: GroupSpec = geometry.groups[index]
        self.block_size = self.spec.block_size
        self.alignment = geometry.alignment
        self.draft = geometry.is_draft(index)
        # Under the EAGLE drop a draft group must also hold the block starting at r (§4).
        self.peek = 1 if (self.draft and geometry.eagle_drop) else 0

    @property
    def successor_keys(self) -> bool:
        """Draft groups under `eagle_reuse=successor` key blocks by the next token too."""
        return False

    @abstractmethod
    def needed(self, r: int) -> range:
        """Block indices a request resuming at `r` must hold (§4)."""

    @abstractmethod
    def longest_hit(self, keys: Sequence[bytes], cached: Container[bytes], cap: int) -> int:
        """Largest aligned resume point `<= cap` this group can serve (§5)."""

    @abstractmethod
    def first_kept_block(self, processed: int, floor_token: int | None = None) -> int:
        """Index of the first block a request that processed `processed` tokens still reads."""

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks covering positions `[0, num_tokens)`."""
        return -(-num_tokens // self.block_size)

    def align_down(self, tokens: int) -> int:
        return max(0, tokens) // self.alignment * self.alignment
