"""`--kv-transport nixl`: NIXL with its UCX backend on registered host memory (DRAM).

Push on request, so the allow-list is enforced for real: D registers its KV buffer with
its own NIXL agent and registers its agent metadata and buffer address with P once per
connection (authenticated; registrations.py); P
validates the read against the allow-list, then WRITEs the allowed pages into D's
buffer with a notification per chunk. D treats a chunk as landed only when that
notification has arrived (UCX delivers it after the chunk's data), then verifies the
digests. P's agent metadata is never published, so D holds no remote key to P's memory
and cannot READ it. (Caveat, docs/transports.md: a remote key is a capability only as
strong as UCX makes it; on one host, any process of the same user can read P's memory
through the OS anyway.)

Install (CPU machines, keeps torch as is): see docs/transports.md.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
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

INSTALL_HINT = "pip install nixl-cu12==1.5.1 (after torch; see docs/transports.md)"
# The agents this process created: once there is one, UCX and its modules are loaded.
_AGENTS: list[str] = []


@cache
def _nixl_api() -> Any:
    try:  # the `nixl` front end (meta package), if installed
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:  # the backend wheel alone is enough on a CPU machine
        from nixl_cu12._api import nixl_agent, nixl_agent_config

    for name in ("nixl", "nixl_cu12"):  # they log INFO to stdout
        logging.getLogger(name).setLevel(logging.WARNING)
    return nixl_agent, nixl_agent_config


def _new_agent(prefix: str) -> Any:
    nixl_agent, nixl_agent_config = _nixl_api()
    name = f"relaykv-{prefix}-{uuid.uuid4().hex}"
    agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
    _AGENTS.append(name)
    return agent


class NixlSink(DirectRegistration, frozen=True):
    """D's registration: its agent (name and metadata) and its KV rows."""

    agent: str = ""
    metadata: bytes = b""


class NixlReceiver(ReceiverPlane):
    remote_writes = True

    def __init__(self, buffer: np.ndarray, layout: PageLayout) -> None:
        self._agent = _new_agent("d")
        self._buffer = buffer
        self._reg = self._agent.register_memory(
            [(buffer.ctypes.data, buffer.nbytes, 0, "")], "DRAM"
        )
        self._sink = msgspec.msgpack.encode(
            NixlSink(
                buffer.ctypes.data,
                layout.num_blocks,
                layout.block_bytes,
                self._agent.name,
                self._agent.get_agent_metadata(),
            )
        )
        self._active: set[str] = set()
        self._landed: set[str] = set()

    def registration(self) -> bytes:
        return self._sink

    def reserve(self, transfer_id: str, total_bytes: int, window: int) -> tuple[bytes, int]:
        self._active.add(transfer_id)
        return b"", window

    def progress(self) -> bool:
        notifs = self._agent.get_new_notifs()
        got = False
        for messages in notifs.values():
            for raw in messages:
                tag = raw.decode(errors="replace")
                if tag.partition(":")[0] in self._active:
                    self._landed.add(tag)
                    got = True
        return got

    def wants_fast_poll(self) -> bool:
        return True

    def land(
        self,
        transfer_id: str,
        index: int,
        slot: int,
        pages: Sequence[PageCopy],
        frames: Sequence[Any],
        dst: np.ndarray,
    ) -> bool:
        tag = f"{transfer_id}:{index}"
        if tag not in self._landed:
            return False
        self._landed.discard(tag)
        return True

    def forget(self, transfer_id: str, clean: bool) -> None:
        self._active.discard(transfer_id)
        self._landed = {t for t in self._landed if not t.startswith(transfer_id)}

    def close(self) -> None:
        try:
            self._agent.deregister_memory(self._reg)
        except Exception:  # closing anyway
            logging.getLogger(__name__).debug("nixl deregister failed", exc_info=True)


class _NixlWrite(PendingChunk):
    def __init__(self, agent: Any, handle: Any) -> None:
        self._agent = agent
        self._handle = handle
        self._released = False

    def poll(self) -> bool:
        if self._released:
            return True
        state = self._agent.check_xfer_state(self._handle)
        if state == "PROC":
            return False
        self._release()
        if state != "DONE":
            raise TransferError(f"NIXL write failed ({state})")
        return True

    def abort(self) -> bool:
        try:
            self._release()  # NIXL cancels an active transfer on release
            return True
        except Exception:
            return False

    def _release(self) -> None:
        if not self._released:
            self._agent.release_xfer_handle(self._handle)
            self._released = True


class NixlSender(DirectWriteSender):
    registration_type = NixlSink

    def __init__(self, buffer: np.ndarray, layout: PageLayout) -> None:
        super().__init__(layout.block_bytes)
        self._agent = _new_agent("p")
        self._regs = [
            self._agent.register_memory([(buffer.ctypes.data, buffer.nbytes, 0, "")], "DRAM"),
            self._agent.register_memory(
                [(self.scratch.ctypes.data, self.scratch.nbytes, 0, "")], "DRAM"
            ),
        ]
        self._remotes: set[str] = set()

    def connect(self, spec: NixlSink) -> None:
        if spec.agent in self._remotes:
            raise ValueError(f"NIXL agent {spec.agent!r} is registered already")
        loaded = self._agent.add_remote_agent(spec.metadata)
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded != spec.agent:
            self._agent.remove_remote_agent(loaded)
            raise ValueError(f"NIXL metadata is for agent {loaded!r}, not {spec.agent!r}")
        self._remotes.add(spec.agent)

    def destination_of(self, registered: NixlSink) -> str:
        return registered.agent

    def disconnect(self, spec: NixlSink) -> None:
        if spec.agent in self._remotes:
            self._remotes.discard(spec.agent)
            with contextlib.suppress(Exception):
                self._agent.remove_remote_agent(spec.agent)

    def post(self, sink: NixlSink, writes: list[Write], tag: str) -> PendingChunk:
        handle = self._agent.initialize_xfer(
            "WRITE",
            self._agent.get_xfer_descs([(src, n, 0) for src, _, n in writes], "DRAM"),
            self._agent.get_xfer_descs([(dst, n, 0) for _, dst, n in writes], "DRAM"),
            sink.agent,
            tag.encode(),
        )
        write = _NixlWrite(self._agent, handle)
        if self._agent.transfer(handle) == "ERR":
            write.abort()
            raise TransferError("NIXL refused to post the write")
        return write

    def close(self) -> None:
        for name in list(self._remotes):
            with contextlib.suppress(Exception):
                self._agent.remove_remote_agent(name)
        for reg in self._regs:
            with contextlib.suppress(Exception):
                self._agent.deregister_memory(reg)


class NixlTransport(KVTransport):
    name = "nixl"
    summary = "NIXL (UCX backend) on registered host memory; P writes into D (push)"

    @classmethod
    def availability(cls) -> str | None:
        try:
            _nixl_api()
        except Exception as exc:  # ImportError, or a backend that fails to load
            return f"nixl is not importable ({exc}); install: {INSTALL_HINT}"
        return None

    @classmethod
    def skips_library_destructors(cls) -> bool:
        """True once this process created an agent. nixl-cu12 bundles UCX with its own
        libibverbs and libnl, but UCX's EFA module links the system's libefa, which brings
        the system's libibverbs and libnl too (where rdma-core is installed). The two libnl
        copies share one symbol scope, so at exit the second copy's destructors unregister
        traffic-control ops that the first copy's list never accepted: SIGSEGV in
        `rtnl_tc_unregister` after a clean shutdown (exit status 139). Releasing the
        agents first does not help; the crash is in the C runtime's exit, not in NIXL."""
        return bool(_AGENTS)

    def sender_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> SenderPlane:
        return NixlSender(buffer, layout)

    def receiver_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> ReceiverPlane:
        return NixlReceiver(buffer, layout)
