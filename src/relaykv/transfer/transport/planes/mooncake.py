"""`--kv-transport mooncake`: Mooncake Transfer Engine, TCP protocol, P2P handshake.

Push on request: D registers its KV buffer with its own TransferEngine and registers its
session (`host:rpc_port`) and buffer address with P once per connection (authenticated;
registrations.py); P validates the read against
the allow-list, then WRITEs the allowed pages into D's buffer. P never registers its own
KV buffer, and Mooncake's TCP server refuses any address outside a registered buffer,
so a peer cannot READ P's pages at all (checked in tests/transfer). A write completes at
P only after D's side stored it; D then verifies the digests.

Caveat (docs/transports.md): Mooncake 0.3.13's engine listens on all interfaces whatever
`--kv-transfer-host` says; only the ZeroMQ control socket honours the host.

Install: `apt-get install -y libibverbs1` and `pip install
mooncake-transfer-engine-non-cuda==0.3.13.post1`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from typing import Any

import msgspec
import numpy as np

from relaykv.transfer.transport.base import KVTransport, TransportOptions
from relaykv.transfer.transport.errors import TransferError
from relaykv.transfer.transport.layout import PageCopy, PageLayout
from relaykv.transfer.transport.planes.base import PendingChunk, ReceiverPlane, SenderPlane
from relaykv.transfer.transport.planes.direct import DirectRegistration, DirectWriteSender, Write

INSTALL_HINT = (
    "apt-get install -y libibverbs1 && pip install mooncake-transfer-engine-non-cuda==0.3.13.post1"
)


@cache
def _engine_class() -> Any:
    os.environ.setdefault("GLOG_minloglevel", "2")  # its INFO/WARNING lines are noise here
    from mooncake.engine import TransferEngine

    return TransferEngine


def _new_engine(host: str) -> tuple[Any, str]:
    engine = _engine_class()()
    rc = engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise TransferError(f"Mooncake TransferEngine.initialize({host!r}) failed ({rc})")
    return engine, f"{host}:{engine.get_rpc_port()}"


class MooncakeSink(DirectRegistration, frozen=True):
    """D's registration: its engine's session (`host:rpc_port`) and its KV rows."""

    session: str = ""


class MooncakeReceiver(ReceiverPlane):
    remote_writes = True

    def __init__(self, buffer: np.ndarray, layout: PageLayout, host: str) -> None:
        self._engine, session = _new_engine(host)
        self._base = buffer.ctypes.data
        rc = self._engine.register_memory(self._base, buffer.nbytes)
        if rc != 0:
            raise TransferError(f"Mooncake register_memory failed ({rc})")
        self._sink = msgspec.msgpack.encode(
            MooncakeSink(self._base, layout.num_blocks, layout.block_bytes, session)
        )

    def registration(self) -> bytes:
        return self._sink

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
        return True  # P announces a chunk only after its write completed here

    def close(self) -> None:
        self._engine.unregister_memory(self._base)


class _MooncakeWrite(PendingChunk):
    """One write per page: with 0.3.13.post1, `transfer_check_status` on a multi-entry
    batch reported success before every entry had landed (the digest check caught it),
    so each page gets its own batch id."""

    def __init__(self, engine: Any, batch_ids: list[int], error: str | None = None) -> None:
        self._engine = engine
        self._running = list(batch_ids)
        self._error = error  # raised once the writes that did start have finished

    def poll(self) -> bool:
        still = []
        for batch_id in self._running:
            state = self._engine.transfer_check_status(batch_id)
            if state == 0:
                still.append(batch_id)
            elif state != 1:
                self._running = []
                reason = "timed out" if state == -2 else "failed"
                raise TransferError(f"Mooncake write {reason} ({state})")
        self._running = still
        if not still and self._error is not None:
            raise TransferError(self._error)
        return not still

    def abort(self) -> bool:
        # Mooncake cannot cancel a write: report whether any is still running
        try:
            return self.poll()
        except TransferError:
            return True


class MooncakeSender(DirectWriteSender):
    registration_type = MooncakeSink

    def __init__(self, host: str, block_bytes: int) -> None:
        super().__init__(block_bytes)
        self._engine, _ = _new_engine(host)

    def connect(self, spec: MooncakeSink) -> None:
        host, _, port = spec.session.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad Mooncake session {spec.session!r}")

    def destination_of(self, registered: MooncakeSink) -> str:
        return f"{registered.session}@{registered.base:x}"

    def post(self, sink: MooncakeSink, writes: list[Write], tag: str) -> PendingChunk:
        batch_ids: list[int] = []
        for source, target, length in writes:
            batch_id = self._engine.transfer_submit_write(sink.session, source, target, length)
            if batch_id < 0:
                error = f"Mooncake could not start a write to {sink.session} ({batch_id})"
                return _MooncakeWrite(self._engine, batch_ids, error)
            batch_ids.append(batch_id)
        return _MooncakeWrite(self._engine, batch_ids)


class MooncakeTransport(KVTransport):
    name = "mooncake"
    summary = "Mooncake Transfer Engine (TCP, P2P handshake); P writes into D (push)"

    @classmethod
    def availability(cls) -> str | None:
        try:
            _engine_class()
        except Exception as exc:  # ImportError, or libibverbs missing
            return f"mooncake is not importable ({exc}); install: {INSTALL_HINT}"
        return None

    def sender_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> SenderPlane:
        return MooncakeSender(options.host, layout.block_bytes)

    def receiver_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> ReceiverPlane:
        return MooncakeReceiver(buffer, layout, options.host)
