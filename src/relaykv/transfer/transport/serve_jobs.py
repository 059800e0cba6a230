"""The serving side's records: events for P's engine and one transfer being served."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from relaykv.transfer.transport.faults import FaultPlan
from relaykv.transfer.transport.grants import Grant
from relaykv.transfer.transport.layout import PageCopy


@dataclass(frozen=True, slots=True)
class ServeEvent:
    """Something P's engine may act on.

    kind: `read_ok` (D verified every page of a transfer), `read_failed` (the transfer
    failed: D's verdict or P's error), `refused` (a read was refused), `expired` (a lease
    ran out; the request's blocks may be freed), `dropped` (fault injection).
    """

    kind: str
    request_id: str
    transfer_id: str = ""
    nbytes: int = 0
    detail: str = ""


@dataclass(slots=True)
class ServeJob:
    identity: bytes
    transfer_id: str
    request_id: str
    pages: list[PageCopy]
    grant: Grant
    sink: Any
    window: int
    deadline: float
    faults: FaultPlan
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (first page, count)
    next_chunk: int = 0
    credited: int = 0
    pending: deque = field(default_factory=deque)  # (index, first, count, PendingChunk, digests)
    not_before: float = 0.0
    pages_sent: int = 0
    done_sent: bool = False
    dead: bool = False  # die_after_pages fired: silent from now on
    cancelled: bool = False


def plan_chunks(pages: list[PageCopy], limit: int) -> list[tuple[int, int]]:
    """Split pages into chunks of whole pages, each up to `limit` bytes (>= 1 page)."""
    chunks: list[tuple[int, int]] = []
    first, size = 0, 0
    for i, page in enumerate(pages):
        if i > first and size + page.nbytes > limit:
            chunks.append((first, i - first))
            first, size = i, 0
        size += page.nbytes
    chunks.append((first, len(pages) - first))
    return chunks
