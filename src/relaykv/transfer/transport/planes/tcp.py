"""`--kv-transport tcp`: page bytes ride the ZeroMQ control connection as extra frames.

For two hosts without extra libraries. P copies each page of a chunk into a message
frame after validating the read; D copies the frames into its destination pages and
verifies them. Credits (window) bound how much is queued in ZeroMQ at once.

`--kv-link-gbps G` shapes the sends like a link of G Gbit/s between two hosts, for
experiments on one machine (docs/transports.md, "A link-shaped tcp transport"): chunks
leave P one after another, each holding the link for `bytes * 8 / G` seconds, and a chunk's
frames are handed to ZeroMQ only when its last bit would have left. What a policy saves
in bytes then shows as time, as it would between hosts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from relaykv.transfer.transport.base import KVTransport, TransportOptions
from relaykv.transfer.transport.errors import ShortTransferError
from relaykv.transfer.transport.layout import PageCopy, PageLayout
from relaykv.transfer.transport.planes.base import (
    PendingChunk,
    ReadyChunk,
    ReceiverPlane,
    SenderPlane,
)
from relaykv.transfer.transport.wire.integrity import page_digest


class LinkPacer:
    """A serial link of `gbps` Gbit/s shared by every transfer of one sender.

    `reserve(nbytes)` books the link for `nbytes` after whatever is already booked and
    returns when the last bit leaves (monotonic seconds)."""

    def __init__(self, gbps: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not gbps > 0:
            raise ValueError(f"link rate must be > 0 Gbit/s, got {gbps}")
        self.bytes_per_s = gbps * 1e9 / 8
        self.clock = clock
        self.busy_until = 0.0

    def reserve(self, nbytes: int) -> float:
        start = max(self.clock(), self.busy_until)
        self.busy_until = start + nbytes / self.bytes_per_s
        return self.busy_until


class PacedChunk(PendingChunk):
    """A chunk whose frames are ready but may go only once the link has carried them."""

    __slots__ = ("clock", "digests", "frames", "ready_at")

    def __init__(
        self, frames: Sequence[Any], digests: list[int], ready_at: float, clock: Callable[[], float]
    ) -> None:
        self.frames, self.digests, self.ready_at, self.clock = frames, digests, ready_at, clock

    def poll(self) -> bool:
        return self.clock() >= self.ready_at


class TcpSender(SenderPlane):
    def __init__(self, pacer: LinkPacer | None = None) -> None:
        self.pacer = pacer

    def send_chunk(
        self,
        sink: Any,
        src: np.ndarray,
        pages: Sequence[PageCopy],
        index: int,
        transfer_id: str,
        corrupt: int | None,
    ) -> PendingChunk:
        frames: list[bytes] = []
        digests = []
        for i, page in enumerate(pages):
            data = src[page.src, : page.nbytes].tobytes()  # a copy: P may reuse the block
            digests.append(page_digest(data))
            if i == corrupt:
                flipped = bytearray(data)
                flipped[len(flipped) // 2] ^= 0xFF
                data = bytes(flipped)
            frames.append(data)
        if self.pacer is not None:
            ready_at = self.pacer.reserve(sum(len(f) for f in frames))
            return PacedChunk(frames, digests, ready_at, self.pacer.clock)
        return ReadyChunk(frames, digests)


class TcpReceiver(ReceiverPlane):
    def reserve(self, transfer_id: str, total_bytes: int, window: int) -> tuple[bytes, int]:
        return b"", window

    def land(
        self,
        transfer_id: str,
        index: int,
        slot: int,
        pages: Sequence[PageCopy],
        frames: Sequence[Any],
        dst: np.ndarray,
    ) -> bool:
        if len(frames) != len(pages):
            raise ShortTransferError(f"{len(frames)} page frames for {len(pages)} pages")
        for page, frame in zip(pages, frames, strict=True):
            data = np.frombuffer(frame.buffer, dtype=np.uint8)
            if data.size != page.nbytes:
                raise ShortTransferError(
                    f"page for dst block {page.dst}: {data.size} bytes arrived, "
                    f"{page.nbytes} expected"
                )
            dst[page.dst, : page.nbytes] = data
        return True


class TcpTransport(KVTransport):
    name = "tcp"
    summary = "pages as ZeroMQ frames over TCP (two hosts, no extra libraries)"

    def sender_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> SenderPlane:
        return TcpSender(LinkPacer(options.link_gbps) if options.link_gbps else None)

    def receiver_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> ReceiverPlane:
        return TcpReceiver()
