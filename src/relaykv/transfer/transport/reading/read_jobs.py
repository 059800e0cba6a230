"""The reading side's records: one connection to a serving endpoint, one read in flight.

A `ReadJob` checks what P announces (chunks in sequence, inside the pages asked for) and its
own clocks: the connect deadline (PeerUnreachable), the read's deadline (TransferTimeout),
and the idle limit: a read that has heard nothing from P for `idle_timeout_s` while it is
not itself busy landing chunks fails at once (a hung or SIGSTOPped P), so the request that
waits on it recomputes instead of holding its slot for the whole transfer timeout.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import zmq

from relaykv.transfer.transport.errors import (
    PeerUnreachable,
    ShortTransferError,
    TransferError,
    TransferTimeout,
)
from relaykv.transfer.transport.layout import PageCopy
from relaykv.transfer.transport.reading.handle import TransferHandle
from relaykv.transfer.transport.wire import control


@dataclass(slots=True)
class Peer:
    endpoint: str
    sock: zmq.Socket
    monitor: zmq.Socket
    connected: bool = False
    jobs: set[str] = field(default_factory=set)


@dataclass(slots=True)
class ReadJob:
    handle: TransferHandle
    peer: Peer
    pages: list[PageCopy]
    deadline: float
    connect_deadline: float
    timeout_s: float
    idle_timeout_s: float = 5.0
    sent: bool = False
    saw_connection: bool = False
    last_heard: float = 0.0  # when P last said anything about this read
    next_index: int = 0  # next chunk index expected from P
    announced_page: int = 0  # pages announced by P so far
    landed_page: int = 0  # pages landed and verified
    announced: deque = field(default_factory=deque)  # (control.Chunk, frames)
    claimed: int | None = None

    def accept_chunk(self, msg: control.Chunk, frames: list) -> None:
        """Queue an announced chunk; it must follow the previous one exactly."""
        count = len(msg.digests)
        if msg.index != self.next_index or msg.first_page != self.announced_page or count < 1:
            raise ShortTransferError(
                f"chunk {msg.index} (pages {msg.first_page}+{count}) out of sequence: expected "
                f"chunk {self.next_index} at page {self.announced_page}"
            )
        if msg.first_page + count > len(self.pages):
            raise TransferError(
                f"chunk {msg.index} runs past the {len(self.pages)} pages asked for"
            )
        self.next_index += 1
        self.announced_page += count
        self.announced.append((msg, frames))

    def check_time(self, now: float, connect_timeout_s: float) -> None:
        if self.peer.connected:
            self.saw_connection = True
        if not self.saw_connection and now > self.connect_deadline:
            raise PeerUnreachable(
                f"could not connect to {self.peer.endpoint} (engine "
                f"{self.handle.source.engine_id!r}) within "
                f"{min(self.timeout_s, connect_timeout_s):.1f}s"
            )
        where = (
            f"transfer {self.handle.transfer_id[:8]} of {self.handle.request_id!r} from "
            f"{self.peer.endpoint}: {self.landed_page}/{len(self.pages)} pages"
        )
        if now > self.deadline:
            raise TransferTimeout(f"{where} after {self.timeout_s:.1f}s")
        if self.sent and not self.announced and now - self.last_heard > self.idle_timeout_s:
            raise TransferTimeout(
                f"{where}, nothing from the sender for {self.idle_timeout_s:.1f}s (hung?)"
            )
