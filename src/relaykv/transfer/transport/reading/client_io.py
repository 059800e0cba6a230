"""The reading side's IO thread: the conversation with serving endpoints (client.py's engine).

`ReaderIO` is the part of `TransferClient` that runs on its background thread: it admits
reads, connects to and registers with each serving endpoint, sends Reads once a plane has
room, lands and verifies announced chunks, enforces every deadline, and resolves handles.
Nothing here is called from the engine thread; the two sides share only thread-safe queues
and the `_finished` deque (see client.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import time
from collections import deque

import msgspec
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from relaykv.transfer.transport.descriptor import KVSourceDescriptor
from relaykv.transfer.transport.errors import (
    PeerLost,
    PeerUnreachable,
    ShortTransferError,
    TransferError,
    error_from_code,
)
from relaykv.transfer.transport.layout import PageLayout
from relaykv.transfer.transport.planes.base import ReceiverPlane
from relaykv.transfer.transport.reading.handle import TransferHandle, TransferResult
from relaykv.transfer.transport.reading.read_jobs import Peer, ReadJob
from relaykv.transfer.transport.wire import control
from relaykv.transfer.transport.wire.integrity import verify_destination
from relaykv.transfer.transport.wire.sockets import connect_dealer

log = logging.getLogger(__name__)


class ReaderIO:
    """The IO-thread half of `TransferClient` (state is set up by its constructor)."""

    layout: PageLayout
    _transport: str
    _plane: ReceiverPlane
    _buffer: np.ndarray
    _engine_id: str
    _connect_timeout_s: float
    _window: int
    _ctx: zmq.Context
    _submit: queue.SimpleQueue
    _notes: queue.SimpleQueue
    _waiting: deque[ReadJob]
    _jobs: dict[str, ReadJob]
    _peers: dict[str, Peer]
    _finished: deque[TransferHandle]
    _stats: dict[str, int]
    _wake_r: int
    _codec: control.Codec

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
                if job.handle.transfer_id in self._jobs:
                    job.check_time(now, self._connect_timeout_s)
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

    def _peer(self, source: KVSourceDescriptor) -> Peer:
        endpoint = source.endpoint
        peer = self._peers.get(endpoint)
        if peer is None:
            sock, monitor = connect_dealer(self._ctx, endpoint, ":" in source.host)
            peer = Peer(endpoint, sock, monitor)
            self._peers[endpoint] = peer
        return peer

    def _admit(self, job: ReadJob) -> None:
        job.peer = self._peer(job.handle.source)
        job.peer.jobs.add(job.handle.transfer_id)
        self._jobs[job.handle.transfer_id] = job
        self._waiting.append(job)

    def _start_waiting(self, now: float) -> None:
        still: deque[ReadJob] = deque()
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
            msg = control.Read(
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
            job.last_heard = now
        self._waiting = still

    def _on_monitor(self, peer: Peer) -> None:
        while True:
            try:
                event = recv_monitor_message(peer.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_CONNECTED:
                peer.connected = True
                # every (re)connection may reach a fresh P: register before any Read
                self._send(peer, control.Register(self._engine_id, self._plane.registration()))
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
            elif event["event"] == zmq.EVENT_CONNECT_RETRIED and not peer.connected:
                # The connection was refused: nothing listens there (a dead P; a restarted
                # one holds none of the old grants). Reads not yet sent fail now, not at the
                # connect deadline (a hung P accepts connections and is caught by that).
                for tid in list(peer.jobs):
                    job = self._jobs.get(tid)
                    if job is not None and not job.sent:
                        self._fail(
                            job,
                            PeerUnreachable(
                                f"{peer.endpoint} refused the connection (engine "
                                f"{job.handle.source.engine_id!r} is not running)"
                            ),
                            clean=True,  # no Read reached it: it writes nothing
                        )

    def _drain(self, peer: Peer) -> None:
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
            job.last_heard = time.monotonic()
            try:
                self._on_message(job, msg, parts[2:])
            except TransferError as exc:
                self._fail(job, exc)

    def _on_message(self, job: ReadJob, msg: control.ToClient, frames: list) -> None:
        if isinstance(msg, control.Refused | control.Failed):
            # the server has stopped this transfer: its resources can be reused at once
            self._fail(
                job, error_from_code(msg.code, f"{job.peer.endpoint}: {msg.reason}"), clean=True
            )
            return
        if isinstance(msg, control.Done):
            job.claimed = msg.num_pages
            return
        job.accept_chunk(msg, frames)

    def _land(self, job: ReadJob) -> None:
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
            self._send(job.peer, control.Credit(tid, chunk.index))
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

    def _succeed(self, job: ReadJob) -> None:
        tid = job.handle.transfer_id
        self._send(job.peer, control.Ack(tid, True))
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

    def _fail(self, job: ReadJob, exc: TransferError, clean: bool = False) -> None:
        """End a job with `exc`. `clean`: the server is known to write nothing more."""
        tid = job.handle.transfer_id
        if tid not in self._jobs:
            return
        if job.sent and job.peer.connected:
            self._send(job.peer, control.Ack(tid, False, exc.code, str(exc)))
        exc.dst_quiesced = clean or not self._plane.remote_writes
        self._forget(job, clean=clean)
        self._stats["failed"] += 1
        job.handle._future.set_exception(exc)
        self._finished.append(job.handle)

    def _forget(self, job: ReadJob, clean: bool) -> None:
        tid = job.handle.transfer_id
        self._jobs.pop(tid, None)
        job.peer.jobs.discard(tid)
        job.announced.clear()
        if job.sent:
            self._plane.forget(tid, clean)

    def _send(self, peer: Peer, msg: msgspec.Struct) -> None:
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
