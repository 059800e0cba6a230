"""The reading side (D): start reads, poll them from the engine's step loop, or block.

`TransferClient.start_read` returns a `TransferHandle` at once; a background IO thread
talks to the serving endpoints, lands each chunk in the destination pages, verifies the
chunk's digests over those pages, and resolves the handle. Nothing here ever waits
without a deadline: every transfer ends by its timeout with a `TransferError` at worst.

Rules for the caller (the connector):
* the destination blocks belong to the transfer until its handle is done: do not read,
  write, hash or free them before;
* on failure the destination pages are garbage: free them and publish nothing
  (docs/design.md §7);
* hash received blocks only after the handle reports success (docs/design.md §7: "received
  blocks get hashes only after the transfer has completed").
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence

import msgspec
import numpy as np
import zmq

from relaykv.transfer.transport.descriptor import KVSourceDescriptor
from relaykv.transfer.transport.layout import PageCopy, PageLayout, check_destination_pages
from relaykv.transfer.transport.planes.base import ReceiverPlane
from relaykv.transfer.transport.reading.client_io import ReaderIO
from relaykv.transfer.transport.reading.handle import TransferHandle, TransferResult
from relaykv.transfer.transport.reading.read_jobs import Peer, ReadJob
from relaykv.transfer.transport.wire import control
from relaykv.transfer.transport.wire.auth import MessageAuth, default_secret

log = logging.getLogger(__name__)


class TransferClient(ReaderIO):
    """Reads pages into `buffer` from serving endpoints (see module docstring)."""

    def __init__(
        self,
        *,
        transport: str,
        plane: ReceiverPlane,
        buffer: np.ndarray,
        layout: PageLayout,
        engine_id: str,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        idle_timeout_s: float = 5.0,
        window: int = 4,
        context: zmq.Context | None = None,
        secret: bytes | None = None,
    ) -> None:
        self.layout = layout
        self._transport = transport
        self._plane = plane
        self._buffer = buffer
        self._engine_id = engine_id
        self._timeout_s = float(timeout_s)
        self._connect_timeout_s = float(connect_timeout_s)
        self._idle_timeout_s = float(idle_timeout_s)
        self._window = max(1, int(window))
        self._ctx = context or zmq.Context.instance()
        self._submit: queue.SimpleQueue[ReadJob | None] = queue.SimpleQueue()
        # (source, request id, message): fire-and-forget notes to a serving endpoint.
        self._notes: queue.SimpleQueue[tuple[KVSourceDescriptor, msgspec.Struct]] = (
            queue.SimpleQueue()
        )
        self._waiting: deque[ReadJob] = deque()  # no plane resources yet
        self._jobs: dict[str, ReadJob] = {}
        self._peers: dict[str, Peer] = {}
        self._finished: deque[TransferHandle] = deque()
        self._stats = {"bytes_received": 0, "pages_received": 0, "ok": 0, "failed": 0}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._codec = control.Codec(MessageAuth(default_secret() if secret is None else secret))
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"kv-read-{engine_id}", daemon=True)
        self._thread.start()

    # -- engine-facing API ----------------------------------------------------------------
    def start_read(
        self,
        source: KVSourceDescriptor,
        request_id: str,
        pages: Sequence[PageCopy],
        *,
        timeout_s: float | None = None,
    ) -> TransferHandle:
        """Start copying `pages` (src blocks on `source` -> dst blocks here). Non-blocking.

        Raises ValueError (nothing started) for a wrong transport, a page layout that is
        not the source's, or bad pages."""
        if self._closed:
            raise RuntimeError("transfer client is closed")
        if source.transport != self._transport:
            raise ValueError(
                f"source {source.engine_id!r} serves with {source.transport!r}, this client "
                f"reads with {self._transport!r} (--kv-transport must match)"
            )
        if not source.page_layout.same_pages(self.layout):
            raise ValueError(
                f"page sizes differ: source {source.page_layout.page_bytes} vs local "
                f"{self.layout.page_bytes} (P and D must share a geometry)"
            )
        pages = list(pages)
        check_destination_pages(self.layout, pages)
        timeout = self._timeout_s if timeout_s is None else float(timeout_s)
        if timeout <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout}")
        handle = TransferHandle(
            uuid.uuid4().hex, request_id, source, len(pages), sum(p.nbytes for p in pages)
        )
        now = time.monotonic()
        job = ReadJob(
            handle=handle,
            peer=None,  # type: ignore[arg-type]  # set by the IO thread
            pages=pages,
            deadline=now + timeout,
            connect_deadline=now + min(timeout, self._connect_timeout_s),
            timeout_s=timeout,
            idle_timeout_s=self._idle_timeout_s,
        )
        self._submit.put(job)
        os.write(self._wake_w, b"x")
        return handle

    def release_remote(self, source: KVSourceDescriptor, request_id: str) -> None:
        """Tell `source` this reader will never read `request_id` (P may free it). Fire and
        forget: a lost message only means P frees at lease expiry instead."""
        self._note(source, control.Release(request_id, self._engine_id))

    def keep_alive(self, source: KVSourceDescriptor, request_id: str) -> None:
        """Ask `source` to extend the lease of `request_id`: this reader still means to read
        it (the request waits for admission). Fire and forget, like `release_remote`."""
        self._note(source, control.KeepAlive(request_id, self._engine_id))

    def _note(self, source: KVSourceDescriptor, message: msgspec.Struct) -> None:
        if self._closed:
            raise RuntimeError("transfer client is closed")
        self._notes.put((source, message))
        os.write(self._wake_w, b"n")

    def read(
        self,
        source: KVSourceDescriptor,
        request_id: str,
        pages: Sequence[PageCopy],
        *,
        timeout_s: float | None = None,
    ) -> TransferResult:
        """Blocking helper: start a read and wait for it; raises its TransferError."""
        return self.start_read(source, request_id, pages, timeout_s=timeout_s).result()

    def completed(self) -> list[TransferHandle]:
        """Handles that finished (either way) since the last call; for step loops."""
        out = []
        while self._finished:
            out.append(self._finished.popleft())
        return out

    def stats(self) -> dict[str, int]:
        return dict(self._stats, in_flight=len(self._jobs) + len(self._waiting))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._submit.put(None)
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> TransferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_invariants(self) -> None:
        for tid, job in list(self._jobs.items()):
            assert job.handle.transfer_id == tid
            assert 0 <= job.landed_page <= job.announced_page <= len(job.pages), tid
            assert tid in job.peer.jobs, tid
        check = getattr(self._plane, "check_invariants", None)
        if check is not None:
            check()
