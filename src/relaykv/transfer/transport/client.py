"""The reading side (D): start reads, poll them from the engine's step loop, or block.

`TransferClient.start_read` returns a `TransferHandle` at once; a background IO thread
talks to the serving endpoints, lands each chunk in the destination pages, verifies the
chunk's digests over those pages, and resolves the handle. Nothing here ever waits
without a deadline: every transfer ends by its timeout with a `TransferError` at worst.

Rules for the caller (the connector):
* the destination blocks belong to the transfer until its handle is done: do not read,
  write, hash or free them before;
* on failure the destination pages are garbage: free them and publish nothing
  (KVCACHE.md §7);
* hash received blocks only after the handle reports success (KVCACHE.md §7: "received
  blocks get hashes only after the transfer has completed").
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from relaykv.transfer.transport import wire
from relaykv.transfer.transport.auth import MessageAuth, default_secret
from relaykv.transfer.transport.descriptor import KVSourceDescriptor
from relaykv.transfer.transport.errors import (
    PeerLost,
    PeerUnreachable,
    ShortTransferError,
    TransferError,
    TransferTimeout,
    error_from_code,
)
from relaykv.transfer.transport.handle import TransferHandle, TransferResult
from relaykv.transfer.transport.integrity import verify_destination
from relaykv.transfer.transport.layout import PageCopy, PageLayout, check_destination_pages
from relaykv.transfer.transport.planes import ReceiverPlane

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Peer:
    endpoint: str
    sock: zmq.Socket
    monitor: zmq.Socket
    connected: bool = False
    jobs: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _ReadJob:
    handle: TransferHandle
    peer: _Peer
    pages: list[PageCopy]
    deadline: float
    connect_deadline: float
    timeout_s: float
    sent: bool = False
    saw_connection: bool = False
    next_index: int = 0  # next chunk index expected from P
    announced_page: int = 0  # pages announced by P so far
    landed_page: int = 0  # pages landed and verified
    announced: deque = field(default_factory=deque)  # (wire.Chunk, frames)
    claimed: int | None = None


class TransferClient:
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
        self._window = max(1, int(window))
        self._ctx = context or zmq.Context.instance()
        self._submit: queue.SimpleQueue[_ReadJob | None] = queue.SimpleQueue()
        # (source, request id, message): fire-and-forget notes to a serving endpoint.
        self._notes: queue.SimpleQueue[tuple[KVSourceDescriptor, object]] = queue.SimpleQueue()
        self._waiting: deque[_ReadJob] = deque()  # no plane resources yet
        self._jobs: dict[str, _ReadJob] = {}
        self._peers: dict[str, _Peer] = {}
        self._finished: deque[TransferHandle] = deque()
        self._stats = {"bytes_received": 0, "pages_received": 0, "ok": 0, "failed": 0}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._codec = wire.Codec(MessageAuth(default_secret() if secret is None else secret))
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
        job = _ReadJob(
            handle=handle,
            peer=None,  # type: ignore[arg-type]  # set by the IO thread
            pages=pages,
            deadline=now + timeout,
            connect_deadline=now + min(timeout, self._connect_timeout_s),
            timeout_s=timeout,
        )
        self._submit.put(job)
        os.write(self._wake_w, b"x")
        return handle

    def release_remote(self, source: KVSourceDescriptor, request_id: str) -> None:
        """Tell `source` this reader will never read `request_id` (P may free it). Fire and
        forget: a lost message only means P frees at lease expiry instead."""
        self._note(source, wire.Release(request_id))

    def keep_alive(self, source: KVSourceDescriptor, request_id: str) -> None:
        """Ask `source` to extend the lease of `request_id`: this reader still means to read
        it (the request waits for admission). Fire and forget, like `release_remote`."""
        self._note(source, wire.KeepAlive(request_id))

    def _note(self, source: KVSourceDescriptor, message: object) -> None:
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

    # -- the IO thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except Exception:
            log.exception("kv transfer client IO thread crashed")
        finally:
            self._shutdown()

    def _turn(self) -> bool:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        for peer in self._peers.values():
            poller.register(peer.sock, zmq.POLLIN)
            poller.register(peer.monitor, zmq.POLLIN)
        ready = dict(poller.poll(self._poll_timeout_ms()))
        if self._wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        while True:
            try:
                job = self._submit.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return False
            self._admit(job)
        while True:
            try:
                source, message = self._notes.get_nowait()
            except queue.Empty:
                break
            self._send(self._peer(source), message)
        for peer in list(self._peers.values()):
            if peer.monitor in ready:
                self._on_monitor(peer)
            if peer.sock in ready:
                self._drain(peer)
        self._plane.progress()
        now = time.monotonic()
        self._start_waiting(now)
        for job in list(self._jobs.values()):
            try:
                self._land(job)
                self._check_time(job, now)
            except TransferError as exc:
                self._fail(job, exc)
        return True

    def _poll_timeout_ms(self) -> int:
        if any(j.announced for j in self._jobs.values()) and self._plane.wants_fast_poll():
            return 1
        now = time.monotonic()
        wait = 50.0
        for job in (*self._jobs.values(), *self._waiting):
            wait = min(wait, (job.deadline - now) * 1000)
            if not job.sent:
                wait = min(wait, 5.0)
        return max(0, int(wait))

    def _peer(self, source: KVSourceDescriptor) -> _Peer:
        endpoint = source.endpoint
        peer = self._peers.get(endpoint)
        if peer is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            if ":" in source.host:
                sock.setsockopt(zmq.IPV6, 1)
            monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            sock.connect(endpoint)
            peer = _Peer(endpoint, sock, monitor)
            self._peers[endpoint] = peer
        return peer

    def _admit(self, job: _ReadJob) -> None:
        job.peer = self._peer(job.handle.source)
        job.peer.jobs.add(job.handle.transfer_id)
        self._jobs[job.handle.transfer_id] = job
        self._waiting.append(job)

    def _start_waiting(self, now: float) -> None:
        still: deque[_ReadJob] = deque()
        while self._waiting:
            job = self._waiting.popleft()
            tid = job.handle.transfer_id
            if tid not in self._jobs:
                continue
            if not job.peer.connected:
                still.append(job)
                continue
            reserved = self._plane.reserve(tid, job.handle.nbytes, self._window)
            if reserved is None:
                still.append(job)
                continue
            sink, window = reserved
            job.saw_connection = True
            msg = wire.Read(
                tid,
                job.handle.request_id,
                [p.to_wire() for p in job.pages],
                sink,
                window,
                max(0.0, job.deadline - now),
                self._engine_id,
                time.time(),
            )
            self._send(job.peer, msg)
            job.sent = True
        self._waiting = still

    def _on_monitor(self, peer: _Peer) -> None:
        while True:
            try:
                event = recv_monitor_message(peer.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_CONNECTED:
                peer.connected = True
                # every (re)connection may reach a fresh P: register before any Read
                self._send(peer, wire.Register(self._engine_id, self._plane.registration()))
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                peer.connected = False
                for tid in list(peer.jobs):
                    job = self._jobs.get(tid)
                    if job is not None and job.saw_connection:
                        self._fail(
                            job,
                            PeerLost(
                                f"connection to {peer.endpoint} dropped during transfer "
                                f"{tid[:8]} of {job.handle.request_id!r}"
                            ),
                        )

    def _drain(self, peer: _Peer) -> None:
        while True:
            try:
                parts = peer.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(parts) < 2:
                continue  # not one of ours
            try:
                msg = self._codec.decode_to_client(parts[0].buffer, parts[1].buffer)
            except Exception as exc:
                log.warning(
                    "kv transfer client: undecodable message from %s (%s)", peer.endpoint, exc
                )
                continue
            job = self._jobs.get(msg.transfer_id)
            if job is None:
                continue  # a transfer that already ended
            try:
                self._on_message(job, msg, parts[2:])
            except TransferError as exc:
                self._fail(job, exc)

    def _on_message(self, job: _ReadJob, msg: wire.ToClient, frames: list) -> None:
        if isinstance(msg, wire.Refused | wire.Failed):
            # the server has stopped this transfer: its resources can be reused at once
            self._fail(
                job, error_from_code(msg.code, f"{job.peer.endpoint}: {msg.reason}"), clean=True
            )
            return
        if isinstance(msg, wire.Done):
            job.claimed = msg.num_pages
            return
        # a Chunk: it must follow the previous one exactly
        count = len(msg.digests)
        if msg.index != job.next_index or msg.first_page != job.announced_page or count < 1:
            raise ShortTransferError(
                f"chunk {msg.index} (pages {msg.first_page}+{count}) out of sequence: expected "
                f"chunk {job.next_index} at page {job.announced_page}"
            )
        if msg.first_page + count > len(job.pages):
            raise TransferError(f"chunk {msg.index} runs past the {len(job.pages)} pages asked for")
        job.next_index += 1
        job.announced_page += count
        job.announced.append((msg, frames))

    def _land(self, job: _ReadJob) -> None:
        tid = job.handle.transfer_id
        while job.announced:
            chunk, frames = job.announced[0]
            pages = job.pages[chunk.first_page : chunk.first_page + len(chunk.digests)]
            if not self._plane.land(tid, chunk.index, chunk.slot, pages, frames, self._buffer):
                return
            verify_destination(self._buffer, pages, chunk.digests, chunk.first_page)
            job.announced.popleft()
            job.landed_page += len(pages)
            self._stats["pages_received"] += len(pages)
            self._stats["bytes_received"] += sum(p.nbytes for p in pages)
            self._send(job.peer, wire.Credit(tid, chunk.index))
        if job.landed_page == len(job.pages):
            self._succeed(job)
        elif job.claimed is not None and not job.announced:
            self._fail(
                job,
                ShortTransferError(
                    f"sender claimed {job.claimed} pages but only {job.landed_page} of "
                    f"{len(job.pages)} arrived: destination is garbage"
                ),
                clean=True,
            )  # the sender said Done: it writes nothing more

    def _check_time(self, job: _ReadJob, now: float) -> None:
        if job.handle.transfer_id not in self._jobs:
            return
        if job.peer.connected:
            job.saw_connection = True
        if not job.saw_connection and now > job.connect_deadline:
            raise PeerUnreachable(
                f"could not connect to {job.peer.endpoint} (engine "
                f"{job.handle.source.engine_id!r}) within "
                f"{min(job.timeout_s, self._connect_timeout_s):.1f}s"
            )
        if now > job.deadline:
            raise TransferTimeout(
                f"transfer {job.handle.transfer_id[:8]} of {job.handle.request_id!r} from "
                f"{job.peer.endpoint}: {job.landed_page}/{len(job.pages)} pages after "
                f"{job.timeout_s:.1f}s"
            )

    def _succeed(self, job: _ReadJob) -> None:
        tid = job.handle.transfer_id
        self._send(job.peer, wire.Ack(tid, True))
        self._forget(job, clean=True)
        self._stats["ok"] += 1
        handle = job.handle
        handle._future.set_result(
            TransferResult(
                tid,
                handle.request_id,
                handle.num_pages,
                handle.nbytes,
                time.monotonic() - handle.started,
            )
        )
        self._finished.append(handle)

    def _fail(self, job: _ReadJob, exc: TransferError, clean: bool = False) -> None:
        """End a job with `exc`. `clean`: the server is known to write nothing more."""
        tid = job.handle.transfer_id
        if tid not in self._jobs:
            return
        if job.sent and job.peer.connected:
            self._send(job.peer, wire.Ack(tid, False, exc.code, str(exc)))
        exc.dst_quiesced = clean or not self._plane.remote_writes
        self._forget(job, clean=clean)
        self._stats["failed"] += 1
        job.handle._future.set_exception(exc)
        self._finished.append(job.handle)

    def _forget(self, job: _ReadJob, clean: bool) -> None:
        tid = job.handle.transfer_id
        self._jobs.pop(tid, None)
        job.peer.jobs.discard(tid)
        job.announced.clear()
        if job.sent:
            self._plane.forget(tid, clean)

    def _send(self, peer: _Peer, msg: object) -> None:
        try:
            peer.sock.send_multipart(self._codec.to_server(msg), zmq.NOBLOCK)
        except zmq.Again:
            log.warning("kv transfer client: send queue to %s full; message dropped", peer.endpoint)

    def _shutdown(self) -> None:
        for job in list(self._jobs.values()):
            self._fail(job, TransferError("transfer client closed"))
        for peer in self._peers.values():
            peer.sock.disable_monitor()
            peer.monitor.close(0)
            peer.sock.close(0)
        self._peers.clear()
        self._plane.close()
