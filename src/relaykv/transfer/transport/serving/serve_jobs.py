"""The serving side's records: events for P's engine and one transfer being served."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from relaykv.transfer.transport.errors import TransferError, TransferRefused
from relaykv.transfer.transport.layout import PageCopy, PageLayout
from relaykv.transfer.transport.planes.base import PendingChunk
from relaykv.transfer.transport.serving.allow_list import Grant, GrantTable
from relaykv.transfer.transport.serving.faults import FaultPlan

log = logging.getLogger(__name__)


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

    def can_send(self, now: float) -> bool:
        """A chunk may start: alive, not cancelled, pages left, credit in the window."""
        return (
            not self.dead
            and not self.cancelled
            and self.next_chunk < len(self.chunks)
            and self.next_chunk - self.credited < self.window
            and now >= self.not_before
        )


def parse_pages(layout: PageLayout, raw: list[tuple[int, int, int, int]]) -> list[PageCopy]:
    """A Read's pages, with groups and source blocks in range (else TransferRefused)."""
    if not raw:
        raise TransferRefused("a read needs at least one page")
    pages = []
    for i, (group, src, dst, nbytes) in enumerate(raw):
        if not 0 <= group < layout.num_groups:
            raise TransferRefused(f"page {i}: group {group} out of range")
        if not 0 < src < layout.num_blocks:
            raise TransferRefused(f"page {i}: source block {src} out of range")
        pages.append(PageCopy(group, src, dst, nbytes))
    return pages


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


ORPHAN_WAIT_S = 60.0  # how long an unstoppable write of an ended transfer is awaited


@dataclass(slots=True)
class OrphanWrites:
    """Chunks of ended transfers that could not be stopped: each keeps its grant's copy
    count up until it finishes, so `release` still waits for it (safety rule 4, base.py)."""

    running: list[tuple[PendingChunk, Grant, float]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.running)

    def add(self, pending: PendingChunk, grant: Grant) -> None:
        self.running.append((pending, grant, time.monotonic() + ORPHAN_WAIT_S))

    def poll(self, grants: GrantTable) -> None:
        now = time.monotonic()
        still = []
        for pending, grant, give_up in self.running:
            try:
                finished = pending.poll()
            except TransferError:
                finished = True
            if finished or now > give_up:
                if not finished:
                    log.error("kv transfer server: a write did not finish in %ss", ORPHAN_WAIT_S)
                grants.end(grant)
            else:
                still.append((pending, grant, give_up))
        self.running = still
