"""`--kv-transport tcp`: page bytes ride the ZeroMQ control connection as extra frames.

For two hosts without extra libraries. P copies each page of a chunk into a message
frame after validating the read; D copies the frames into its destination pages and
verifies them. Credits (window) bound how much is queued in ZeroMQ at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from relaykv.transfer.transport.base import KVTransport, TransportOptions
from relaykv.transfer.transport.errors import ShortTransferError
from relaykv.transfer.transport.integrity import page_digest
from relaykv.transfer.transport.layout import PageCopy, PageLayout
from relaykv.transfer.transport.planes import PendingChunk, ReadyChunk, ReceiverPlane, SenderPlane


class TcpSender(SenderPlane):
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
        return TcpSender()

    def receiver_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> ReceiverPlane:
        return TcpReceiver()
