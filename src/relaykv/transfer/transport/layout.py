"""Page addressing in an engine's KV buffer (docs/transports.md).

One engine has ONE host buffer for all KV: a contiguous uint8 array `[num_blocks,
block_bytes]`. A page is (group, block id); it is the first `page_bytes[group]` bytes of
that block's row. Block 0 is the null block: never written, never transferred. P and D
have the same geometry, so a page has the same size on both sides.

Transports never interpret page bytes; they only move `(src block, dst block, nbytes)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relaykv.kvcache.geometry import Geometry

NULL_BLOCK = 0


@dataclass(frozen=True, slots=True)
class PageLayout:
    """Shape of a KV buffer: block count, row bytes, and each group's page bytes."""

    num_blocks: int
    block_bytes: int
    page_bytes: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_blocks < 2:
            raise ValueError(
                f"a KV buffer needs >= 2 blocks (block 0 is null), got {self.num_blocks}"
            )
        if self.block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {self.block_bytes}")
        if not self.page_bytes:
            raise ValueError("a layout needs at least one group")
        object.__setattr__(self, "page_bytes", tuple(int(p) for p in self.page_bytes))
        for g, size in enumerate(self.page_bytes):
            if not 1 <= size <= self.block_bytes:
                raise ValueError(
                    f"group {g} page bytes {size} must be in 1..block_bytes ({self.block_bytes})"
                )

    @classmethod
    def from_geometry(cls, geometry: Geometry, num_blocks: int) -> PageLayout:
        """The layout the model layer builds for `geometry` (pages of bytes_per_token > 0)."""
        return cls(num_blocks, geometry.block_bytes, tuple(g.page_bytes for g in geometry.groups))

    @property
    def num_groups(self) -> int:
        return len(self.page_bytes)

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def to_wire(self) -> list[int]:
        return [self.num_blocks, self.block_bytes, *self.page_bytes]

    @classmethod
    def from_wire(cls, fields: Sequence[int]) -> PageLayout:
        if len(fields) < 3:
            raise ValueError(f"a wire layout has >= 3 fields, got {list(fields)}")
        return cls(int(fields[0]), int(fields[1]), tuple(int(f) for f in fields[2:]))

    def same_pages(self, other: PageLayout) -> bool:
        """True when pages of every group have the same size (what P and D must share)."""
        return self.page_bytes == other.page_bytes


@dataclass(frozen=True, slots=True)
class PageCopy:
    """One page to move: group, source block on P, destination block on D, byte count."""

    group: int
    src: int
    dst: int
    nbytes: int

    def to_wire(self) -> tuple[int, int, int, int]:
        return (self.group, self.src, self.dst, self.nbytes)


def page_copies(
    layout: PageLayout, group_pairs: dict[int, Sequence[tuple[int, int]]]
) -> list[PageCopy]:
    """Build the page list for `{group: [(src block, dst block), ...]}` with full pages."""
    pages: list[PageCopy] = []
    for group in sorted(group_pairs):
        if not 0 <= group < layout.num_groups:
            raise ValueError(f"group {group} out of range 0..{layout.num_groups - 1}")
        size = layout.page_bytes[group]
        pages.extend(PageCopy(group, int(s), int(d), size) for s, d in group_pairs[group])
    return pages


def as_page_array(buffer: Any, layout: PageLayout) -> np.ndarray:
    """A numpy view (no copy) of a KV buffer, checked against `layout`.

    Accepts a CPU torch tensor (viewed through `.numpy()`, which shares memory) or a numpy
    array. The buffer must be uint8, C-contiguous, shaped `[num_blocks, block_bytes]`.
    """
    if hasattr(buffer, "numpy") and not isinstance(buffer, np.ndarray):
        if getattr(buffer, "device", None) is not None and str(buffer.device) != "cpu":
            raise ValueError(f"KV buffer must be in host memory, got device {buffer.device}")
        buffer = buffer.detach().numpy()
    array = np.asarray(buffer)
    if array.dtype != np.uint8:
        raise ValueError(f"KV buffer must be uint8, got {array.dtype}")
    if array.shape != (layout.num_blocks, layout.block_bytes):
        raise ValueError(
            f"KV buffer shape {array.shape} != layout ({layout.num_blocks}, {layout.block_bytes})"
        )
    if not array.flags.c_contiguous:
        raise ValueError("KV buffer must be C-contiguous")
    return array


def check_destination_pages(layout: PageLayout, pages: Iterable[PageCopy]) -> None:
    """D's own checks before asking for pages: valid groups, sizes and distinct dst blocks.

    Raises ValueError naming the first bad page (bad input changes nothing).
    """
    seen: set[int] = set()
    count = 0
    for i, page in enumerate(pages):
        count += 1
        if not 0 <= page.group < layout.num_groups:
            raise ValueError(f"page {i}: group {page.group} out of range")
        if page.nbytes != layout.page_bytes[page.group]:
            raise ValueError(
                f"page {i}: nbytes {page.nbytes} != group {page.group} page bytes "
                f"{layout.page_bytes[page.group]}"
            )
        if not 0 < page.dst < layout.num_blocks:
            raise ValueError(
                f"page {i}: destination block {page.dst} out of range 1..{layout.num_blocks - 1}"
            )
        if page.src == NULL_BLOCK:
            raise ValueError(f"page {i}: source block 0 is the null block (never transferred)")
        if page.dst in seen:
            raise ValueError(f"page {i}: destination block {page.dst} appears twice")
        seen.add(page.dst)
    if count == 0:
        raise ValueError("a transfer needs at least one page")
