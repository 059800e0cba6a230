"""The serving endpoint (P side): one background thread, a ZeroMQ ROUTER, a data plane.

P's engine owns a `TransferServer` for the life of the process. It tells the server which
blocks readers may have (`allow` / `extend` / `release`, allow_list.py) and drains `events()`
to learn when D has verified a request's pages (so it can free them) or when a lease ran
out. The thread serves many transfers at once, one chunk per transfer per turn, so a
slow or dead reader never stops the others; a reader's credits bound what is queued.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import numpy as np
import zmq

from relaykv.transfer.transport.descriptor import KVSourceDescriptor
from relaykv.transfer.transport.errors import TransferError, TransferRefused
from relaykv.transfer.transport.layout import PageLayout
from relaykv.transfer.transport.planes.base import SenderPlane
from relaykv.transfer.transport.serving.allow_list import GrantTable
from relaykv.transfer.transport.serving.faults import NO_FAULTS, FaultPlan
from relaykv.transfer.transport.serving.registrations import ReaderRegistry, ReplayGuard
from relaykv.transfer.transport.serving.serve_jobs import (
    OrphanWrites,
    ServeEvent,
    ServeJob,
    parse_pages,
    plan_chunks,
)
from relaykv.transfer.transport.wire import control
from relaykv.transfer.transport.wire.auth import MessageAuth, default_secret
from relaykv.transfer.transport.wire.integrity import source_digests
from relaykv.transfer.transport.wire.sockets import bind_router

log = logging.getLogger(__name__)

MAX_WINDOW = 64
DONE_GRACE_S = 5.0  # how long a finished transfer waits for D's Ack


class TransferServer:
    """Serves allowed pages of `buffer` to readers; see the module docstring."""

    def __init__(
        self,
        *,
        transport: str,
        plane: SenderPlane,
        buffer: np.ndarray,
        layout: PageLayout,
        engine_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_bytes: int = 4 << 20,
        meta: Mapping[str, str] | None = None,
        context: zmq.Context | None = None,
        secret: bytes | None = None,
    ) -> None:
        self.layout = layout
        self.grants = GrantTable(layout)
        self.readers = ReaderRegistry(plane)
        self._replays = ReplayGuard()
        self._transport = transport
        self._plane = plane
        self._buffer = buffer
        self._engine_id = engine_id
        self._chunk_bytes = max(int(chunk_bytes), layout.block_bytes)
        self._faults = NO_FAULTS
        self._events: deque[ServeEvent] = deque()
        self._jobs: dict[tuple[bytes, str], ServeJob] = {}
        self._orphans = OrphanWrites()
        self._stats = dict.fromkeys(
            ("bytes_sent", "pages_sent", "reads", "refused", "unauthenticated"), 0)
        self._ctx = context or zmq.Context.instance()
        self._sock, port = bind_router(self._ctx, host, port)
        self.descriptor = KVSourceDescriptor(
            engine_id=engine_id,
            transport=transport,
            host=host,
            port=port,
            layout=layout.to_wire(),
            meta=dict(meta or {}),
        )
        self._codec = control.Codec(MessageAuth(default_secret() if secret is None else secret))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-serve-{engine_id}", daemon=True)
        self._started = False

    # -- engine-facing API ----------------------------------------------------------------
    def start(self) -> TransferServer:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def allow(
        self,
        request_id: str,
        blocks: Mapping[int, Iterable[int]],
        lease_deadline: float,
        reader: str | None = None,
    ) -> None:
        """`reader` (None: the first to read) may have `blocks` ({group: [ids]}) until
        `lease_deadline` (time.monotonic() seconds)."""
        self.grants.allow(request_id, blocks, lease_deadline, reader)

    def extend(self, request_id: str, lease_deadline: float) -> None:
        self.grants.extend(request_id, lease_deadline)

    def release(self, request_id: str, wait_s: float = 10.0) -> bool:
        """Revoke a request; when this returns True no copy of its pages is running."""
        return self.grants.release(request_id, wait_s)

    def inject(self, faults: FaultPlan | None) -> None:
        """Install a failure-injection plan (None: behave)."""
        self._faults = faults or NO_FAULTS

    def events(self) -> list[ServeEvent]:
        """Drain what happened since the last call."""
        return [self._events.popleft() for _ in range(len(self._events))]

    def stats(self) -> dict[str, int]:
        return dict(self._stats, transfers_in_flight=len(self._jobs), grants=len(self.grants))

    def close(self) -> None:
        self._stop.set()
        if self._started:
            self._thread.join(timeout=10)
        self._sock.close(0)
        self.readers.close()
        self._plane.close()

    def __enter__(self) -> TransferServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_invariants(self) -> None:
        self.grants.check_invariants()
        for (identity, tid), job in list(self._jobs.items()):
            assert job.identity == identity and job.transfer_id == tid, tid
            assert 0 <= job.credited <= job.next_chunk <= len(job.chunks), tid
            assert job.next_chunk - job.credited <= job.window, tid
            assert sum(c for _, c in job.chunks) == len(job.pages), tid
            assert job.grant.inflight >= len(job.pending), tid

    # -- the serving thread ----------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_sweep = 0.0
        while not self._stop.is_set():
            try:
                if poller.poll(self._poll_timeout_ms()):
                    self._drain()
                self._advance_all()
                if self._orphans:
                    self._orphans.poll(self.grants)
                now = time.monotonic()
                if now - last_sweep > 0.05:
                    if int(now) != int(last_sweep):
                        self.readers.prune()  # once a second: unmap dead readers' memory
                    last_sweep = now
                    for rid in self.grants.sweep_expired():
                        self._events.append(ServeEvent("expired", rid))
                    self._expire_jobs(now)
            except Exception:  # keep serving others; one bad turn must not kill P
                log.exception("kv transfer server turn failed")
        for job in list(self._jobs.values()):
            self._finish(job)

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        wait = 1.0 if self._orphans else 50.0
        for job in self._jobs.values():
            if job.pending:
                return 1 if not job.can_send(now) else 0
            if job.can_send(now):
                return 0
            if job.not_before > now and not job.dead:
                wait = min(wait, (job.not_before - now) * 1000)
        return max(0, int(wait))

    def _drain(self) -> None:
        while True:
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                if len(parts) != 3:
                    raise control.Unauthenticated("wrong frame count: not one of ours")
                identity, tag, payload = parts
                msg = self._codec.decode_to_server(tag, payload)
            except control.Unauthenticated:
                count = self._stats["unauthenticated"] = self._stats["unauthenticated"] + 1
                if count in (1, 10, 100) or not count % 10000:  # a flood must not flood the log
                    log.warning("kv transfer server: %d unauthenticated messages dropped", count)
                continue
            except Exception as exc:
                log.warning("kv transfer server: undecodable message dropped (%s)", exc)
                continue
            if isinstance(msg, control.Register):
                self.readers.register_logged(msg.reader, msg.registration)
                continue
            if isinstance(msg, control.Read):
                self._on_read(identity, msg)
                continue
            if isinstance(msg, (control.Release, control.KeepAlive)):
                if self.grants.allowed(msg.request_id, msg.reader):
                    kind = "released" if isinstance(msg, control.Release) else "keepalive"
                    self._events.append(ServeEvent(kind, msg.request_id))
                continue
            job = self._jobs.get((identity, msg.transfer_id))
            if job is None:
                continue
            if isinstance(msg, control.Credit):
                job.credited = max(job.credited, min(msg.index + 1, job.next_chunk))
            elif isinstance(msg, control.Cancel):
                job.cancelled = True
                self._finish(job)
            elif isinstance(msg, control.Ack):
                kind = "read_ok" if msg.ok else "read_failed"
                nbytes = sum(p.nbytes for p in job.pages) if msg.ok else 0
                self._events.append(
                    ServeEvent(kind, job.request_id, job.transfer_id, nbytes, msg.reason)
                )
                self._finish(job)

    def _on_read(self, identity: bytes, msg: control.Read) -> None:
        self._stats["reads"] += 1
        faults = self._faults if self._faults.applies(msg.request_id) else NO_FAULTS
        if faults.drop:
            self._events.append(ServeEvent("dropped", msg.request_id, msg.transfer_id))
            return
        try:
            stale = self._replays.check(msg.transfer_id, msg.issued_at)
            if stale is not None:
                raise TransferRefused(stale)
            registered = self.readers.get(msg.reader)
            if registered is None:
                raise TransferRefused(f"reader {msg.reader!r} has not registered its memory")
            pages = parse_pages(self.layout, msg.pages)
            grant = self.grants.check_read(msg.request_id, pages, msg.reader)
            try:
                sink = self._plane.open_sink(registered.opened, msg.sink)
                self._plane.check_destinations(sink, pages)
            except (ValueError, KeyError, OSError, TransferError, msgspec.MsgspecError) as exc:
                raise TransferRefused(f"unusable destination: {exc}") from exc
        except TransferRefused as exc:
            self._stats["refused"] += 1
            self._events.append(ServeEvent("refused", msg.request_id, msg.transfer_id, 0, str(exc)))
            self._send(identity, control.Refused(msg.transfer_id, exc.code, str(exc)))
            return
        job = ServeJob(
            identity=identity,
            transfer_id=msg.transfer_id,
            request_id=msg.request_id,
            pages=pages,
            grant=grant,
            sink=sink,
            window=max(1, min(int(msg.window), MAX_WINDOW)),
            deadline=time.monotonic() + max(0.0, float(msg.timeout_s)) + 1.0,
            faults=faults,
        )
        job.chunks = plan_chunks(pages, self._plane.max_chunk_bytes(sink, self._chunk_bytes))
        if faults.delay_s:
            job.not_before = time.monotonic() + faults.delay_s
        self._jobs[(identity, msg.transfer_id)] = job

    def _advance_all(self) -> None:
        now = time.monotonic()
        for job in list(self._jobs.values()):
            try:
                self._complete_pending(job)
                if job.can_send(now):
                    self._start_chunk(job, now)
                    self._complete_pending(job)
                if (
                    not job.done_sent
                    and not job.dead
                    and not job.pending
                    and job.next_chunk == len(job.chunks)
                ):
                    claimed = len(job.pages)  # `short` claims all pages it did not send
                    self._send(job.identity, control.Done(job.transfer_id, claimed))
                    job.done_sent = True
                    job.deadline = min(job.deadline, now + DONE_GRACE_S)
            except TransferError as exc:
                self._fail(job, exc)
            except zmq.ZMQError as exc:  # the reader is gone (ROUTER_MANDATORY)
                self._events.append(
                    ServeEvent(
                        "read_failed", job.request_id, job.transfer_id, 0, f"reader gone: {exc}"
                    )
                )
                self._finish(job)

    def _start_chunk(self, job: ServeJob, now: float) -> None:
        index = job.next_chunk
        first, count = job.chunks[index]
        faults = job.faults
        if faults.short and index == len(job.chunks) - 1:
            count -= 1  # leave out the last page; Done still claims it
        if faults.die_after_pages is not None:
            count = min(count, faults.die_after_pages - job.pages_sent)
        corrupt = None
        if faults.corrupt_page is not None and first <= faults.corrupt_page < first + count:
            corrupt = faults.corrupt_page - first
        job.next_chunk += 1
        if faults.delay_s:
            job.not_before = now + faults.delay_s
        if count <= 0:
            self._maybe_die(job)
            return
        pages = job.pages[first : first + count]
        self.grants.begin(job.grant)  # raises if released/expired: nothing more is read
        try:
            pending = self._plane.send_chunk(
                job.sink, self._buffer, pages, index, job.transfer_id, corrupt
            )
            digests = pending.digests
            if digests is None:  # the grant is held: the source cannot change meanwhile
                digests = source_digests(self._buffer, pages)
        except BaseException:
            self.grants.end(job.grant)
            raise
        job.pending.append((index, first, count, pending, digests))

    def _complete_pending(self, job: ServeJob) -> None:
        while job.pending:
            index, first, count, pending, digests = job.pending[0]
            if not pending.poll():
                return
            job.pending.popleft()
            self.grants.end(job.grant)
            header = control.Chunk(
                job.transfer_id, index, first, digests, self._plane.slot_of(job.sink, index)
            )
            self._send(job.identity, header, pending.frames)
            nbytes = sum(p.nbytes for p in job.pages[first : first + count])
            job.pages_sent += count
            self._stats["bytes_sent"] += nbytes
            self._stats["pages_sent"] += count
            self._maybe_die(job)

    def _maybe_die(self, job: ServeJob) -> None:
        limit = job.faults.die_after_pages
        if limit is not None and job.pages_sent >= limit:
            if job.faults.exit_process:
                os._exit(17)  # a crash, as far as the reader can tell
            job.dead = True

    def _expire_jobs(self, now: float) -> None:
        for job in list(self._jobs.values()):
            if now > job.deadline:
                if not job.done_sent:
                    self._events.append(
                        ServeEvent(
                            "read_failed", job.request_id, job.transfer_id, 0, "reader timed out"
                        )
                    )
                self._finish(job)

    def _fail(self, job: ServeJob, exc: TransferError) -> None:
        self._events.append(ServeEvent("read_failed", job.request_id, job.transfer_id, 0, str(exc)))
        with contextlib.suppress(zmq.ZMQError):
            self._send(job.identity, control.Failed(job.transfer_id, exc.code, str(exc)))
        self._finish(job)

    def _finish(self, job: ServeJob) -> None:
        """Forget a job; abort its in-flight chunks. A chunk that cannot be stopped stays
        an orphan, polled until done, so `release` still waits for it (safety rule 4)."""
        while job.pending:
            _, _, _, pending, _ = job.pending.popleft()
            try:
                stopped = pending.abort()
            except Exception:
                log.exception("kv transfer server: abort failed")
                stopped = False
            if stopped:
                self.grants.end(job.grant)
            else:
                self._orphans.add(pending, job.grant)
        self._jobs.pop((job.identity, job.transfer_id), None)

    def _send(self, identity: bytes, msg: Any, frames: Iterable[Any] = ()) -> None:
        parts = [identity, *self._codec.to_client(msg), *frames]
        self._sock.send_multipart(parts, copy=False)
