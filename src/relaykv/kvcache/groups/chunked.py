"""Chunked-local groups: position p attends to its own chunk, `[floor(p/C)*C, p]`.

Llama-4's local layers (`attention_chunk_size`, C=8192) attend this way: the sequence is cut
into chunks of C tokens and no position reads across a chunk boundary. Resuming at r reads
the chunk of r up to r (plus the peek block for a draft group), so a resume point on a chunk
boundary needs nothing of this group but the peek, and a finished chunk is dead for the
request that wrote it. Everything else (lookup, retention, P/D plan, sizing) follows from
`first_read_block` through `GroupRules` (docs/design.md §1, §4).
"""

from __future__ import annotations

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.groups.base import GroupRules


class ChunkedLocalGroup(GroupRules):
    """Needs the blocks of r's chunk below r (+ peek); frees whole chunks behind it."""

    KIND = "chunked"
    __slots__ = ("chunk",)

    def __init__(self, geometry: Geometry, index: int) -> None:
        super().__init__(geometry, index)
        assert self.spec.chunk is not None
        self.chunk: int = self.spec.chunk

    @property
    def reach(self) -> int:
        return self.chunk

    def first_read_block(self, position: int) -> int:
        return position // self.chunk * self.chunk // self.block_size
