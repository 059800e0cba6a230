"""KV page storage: one uint8 buffer for all groups (docs/transports.md).

* `buffer` is a contiguous `torch.uint8` tensor `[num_blocks, block_bytes]` with
  `block_bytes = geometry.block_bytes` (the largest group page). Transports move its bytes.
* Group g views it as `[num_blocks, L_g, 2, b_g, kv_heads, head_dim]` in the runtime dtype,
  using the first `page_bytes_g` bytes of each row (the rest is padding for smaller groups).
* A page is (group, block id): bytes `[id * block_bytes, id * block_bytes + page_bytes_g)`.
* Block 0 is the null block: it is never written (writes to it raise) and stays all zeros,
  which `check_invariants` verifies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relaykv.model.kv_layout import KVLayout, KVSlot


class KVPageStore:
    """The KV buffer of one engine and its per-group typed views."""

    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        device: torch.device | str = "cpu",
        buffer: torch.Tensor | None = None,
    ) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"need at least 2 blocks (block 0 is the null block), got {num_blocks}"
            )
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_bytes = layout.geometry.block_bytes
        elem = torch.empty((), dtype=layout.dtype).element_size()
        if self.block_bytes % elem:
            raise ValueError("block_bytes must be a multiple of the dtype size")
        # zeros, not empty: a masked-out key still enters the SDPA matmul, and garbage
        # bytes could decode to NaN/inf, which a zero attention weight does not cancel.
        shape = (num_blocks, self.block_bytes)
        if buffer is None:
            self.buffer = torch.zeros(shape, dtype=torch.uint8, device=device)
        else:
            # Memory the caller owns (e.g. a shared-memory segment a transport writes into).
            if tuple(buffer.shape) != shape or buffer.dtype != torch.uint8:
                raise ValueError(f"a KV buffer must be uint8 {shape}, got {buffer.dtype} "
                                 f"{tuple(buffer.shape)}")
            self.buffer = buffer.zero_()
        self.views = [self._group_view(g) for g in range(len(layout.shapes))]

    @classmethod
    def blocks_for_bytes(cls, layout: KVLayout, nbytes: int) -> int:
        """How many blocks fit in `nbytes` (including the null block)."""
        return nbytes // layout.geometry.block_bytes

    def _group_view(self, group: int) -> torch.Tensor:
        page_bytes = self.layout.page_bytes(group)
        typed = self.buffer[:, :page_bytes].view(self.layout.dtype)
        return typed.unflatten(1, self.layout.page_shape(group))

    # -- per-layer access (the model's hot path) --------------------------------------
    def layer_pages(self, slot: KVSlot) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V page views of one layer: each `[num_blocks, block_size, kv_heads, head_dim]`."""
        view = self.views[slot.group]
        return view[:, slot.index, 0], view[:, slot.index, 1]

    # -- whole pages (P/D transfer, tests) --------------------------------------------
    def page_bytes(self, group: int) -> int:
        return self.layout.page_bytes(group)

    def page_range(self, group: int, block_id: int) -> tuple[int, int]:
        """(byte offset in the flat buffer, nbytes) of one page."""
        self._check_ids([block_id], allow_null=True)
        return block_id * self.block_bytes, self.page_bytes(group)

    def read_pages(self, group: int, block_ids: Sequence[int]) -> torch.Tensor:
        """A copy of pages `[n, L, 2, b, kv_heads, head_dim]` in the runtime dtype."""
        self._check_ids(block_ids, allow_null=True)
        index = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.buffer.device)
        return self.views[group][index].clone()

    def write_pages(self, group: int, block_ids: Sequence[int], pages: torch.Tensor) -> None:
        self._check_ids(block_ids, allow_null=False)
        expected = (len(block_ids), *self.layout.page_shape(group))
        if tuple(pages.shape) != expected:
            raise ValueError(f"pages have shape {tuple(pages.shape)}, expected {expected}")
        index = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.buffer.device)
        self.views[group][index] = pages.to(device=self.buffer.device, dtype=self.layout.dtype)

    def read_page_bytes(self, group: int, block_ids: Sequence[int]) -> torch.Tensor:
        """A copy of the raw page bytes `[n, page_bytes]` (uint8)."""
        self._check_ids(block_ids, allow_null=True)
        index = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.buffer.device)
        return self.buffer[index, : self.page_bytes(group)].clone()

    def write_page_bytes(
        self,
        group: int,
        block_ids: Sequence[int],
        data: torch.Tensor | bytes | bytearray | memoryview,
    ) -> None:
        self._check_ids(block_ids, allow_null=False)
        nbytes = self.page_bytes(group)
        if not isinstance(data, torch.Tensor):
            data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data.numel() != len(block_ids) * nbytes:
            raise ValueError(
                f"got {data.numel()} bytes for {len(block_ids)} pages of {nbytes} bytes"
            )
        index = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.buffer.device)
        self.buffer[index, :nbytes] = data.reshape(len(block_ids), nbytes).to(self.buffer.device)

    def _check_ids(self, block_ids: Sequence[int], allow_null: bool) -> None:
        for block in block_ids:
            if not 0 <= block < self.num_blocks:
                raise ValueError(f"block id {block} out of range 0..{self.num_blocks - 1}")
            if block == 0 and not allow_null:
                raise ValueError("block 0 is the null block and is never written")

    # -- invariants ---------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the store is inconsistent (tests call this)."""
        buf = self.buffer
        assert buf.dtype == torch.uint8 and buf.is_contiguous()
        assert tuple(buf.shape) == (self.num_blocks, self.block_bytes)
        for g, view in enumerate(self.views):
            assert view.data_ptr() == buf.data_ptr(), f"group {g} view does not alias the buffer"
            assert view.shape[0] == self.num_blocks
            assert self.page_bytes(g) <= self.block_bytes
        assert not bool(buf[0].any()), "the null block (id 0) was written"
