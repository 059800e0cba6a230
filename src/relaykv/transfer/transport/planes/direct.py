"""The base of the senders that WRITE straight into D's registered memory (nixl, mooncake).

Both register D's whole KV buffer as rows of `block_bytes` at a base address on D's side.
What they share lives here: parsing and checking D's registration (`DirectRegistration`
fields), keeping every destination inside the registered rows, building the
(source address, destination address, bytes) list of a chunk, and the scratch page that
fault injection corrupts instead of P's own KV page. A subclass says how to reach D's engine
(`connect` / `disconnect`) and how to post the writes (`post`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec
import numpy as np

from relaykv.transfer.transport.layout import PageCopy
from relaykv.transfer.transport.planes.base import PendingChunk, SenderPlane, check_rows

Write = tuple[int, int, int]  # (source address, destination address, bytes)


class DirectRegistration(msgspec.Struct, frozen=True):
    """What every direct registration carries (subclasses add how to reach D)."""

    base: int
    num_blocks: int
    block_bytes: int


class DirectWriteSender(SenderPlane):
    registration_type: ClassVar[type[DirectRegistration]]

    def __init__(self, block_bytes: int) -> None:
        self.scratch = np.zeros(block_bytes, dtype=np.uint8)  # fault injection only

    def register(self, registration: bytes) -> DirectRegistration:
        spec = msgspec.msgpack.decode(registration, type=self.registration_type)
        if spec.num_blocks < 2 or spec.block_bytes < 1 or spec.base <= 0:
            raise ValueError("the registration describes no buffer")
        self.connect(spec)
        return spec

    def unregister(self, registered: DirectRegistration) -> None:
        self.disconnect(registered)

    def check_destinations(self, sink: DirectRegistration, pages: Sequence[PageCopy]) -> None:
        check_rows(sink.num_blocks, sink.block_bytes, pages)

    def send_chunk(
        self,
        sink: DirectRegistration,
        src: np.ndarray,
        pages: Sequence[PageCopy],
        index: int,
        transfer_id: str,
        corrupt: int | None,
    ) -> PendingChunk:
        base = src.ctypes.data
        row = src.shape[1]
        writes: list[Write] = []
        for i, page in enumerate(pages):
            addr = base + page.src * row
            if i == corrupt:
                self.scratch[: page.nbytes] = src[page.src, : page.nbytes]
                self.scratch[page.nbytes // 2] ^= 0xFF
                addr = self.scratch.ctypes.data
            writes.append((addr, sink.base + page.dst * sink.block_bytes, page.nbytes))
        return self.post(sink, writes, f"{transfer_id}:{index}")

    @abstractmethod
    def connect(self, spec: Any) -> None:
        """Make D's engine reachable (raise ValueError if the registration is unusable)."""

    def disconnect(self, spec: Any) -> None:
        """Forget D's engine."""

    @abstractmethod
    def post(self, sink: Any, writes: list[Write], tag: str) -> PendingChunk:
        """Start the writes of one chunk; `tag` names it (transfer id:chunk index)."""
