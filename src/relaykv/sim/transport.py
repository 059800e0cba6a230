"""The simulated KV transport: the real `PDConnector` over a modelled link.

`SimTransport` is a `KVTransport` whose `create_server` / `create_client` return in-process
stand-ins with the same methods the connector calls (`allow`, `extend`, `release`,
`events`, `descriptor` on P; `start_read`, `completed`, `release_remote`, `keep_alive` on
D), so P's holding and leases, D's read list (`KVLoad.transfer_pairs`) and the byte counts
are the connector's own. No bytes move: a read becomes a flow on a `SimLink`.

Link model (docs/simulator.md "Link"): every engine has one NIC of the link's bandwidth.
A transfer waits the link's fixed latency (handshake, completion notice), then its bytes
flow at `bandwidth / max(flows out of P's NIC, flows into D's NIC)`, recomputed whenever
a flow starts or ends (processor sharing: concurrent transfers share the link). Safety
rule 1 of `transfer/transport/base.py` holds: a read naming a request P does not hold, or
a block outside what P allowed, fails at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relaykv.sim.clock import EventLoop
from relaykv.sim.hardware import LinkSpec
from relaykv.transfer.transport import KVSourceDescriptor, KVTransport, PageCopy, PageLayout


@dataclass(slots=True)
class SimEvent:
    kind: str  # read_ok | released | keepalive
    request_id: str
    nbytes: int = 0


@dataclass(eq=False, slots=True)
class SimHandle:
    transfer_id: str
    request_id: str
    source: KVSourceDescriptor
    nbytes: int
    status: str = "pending"  # pending | done | failed
    error: BaseException | None = None

    def done(self) -> bool:
        return self.status != "pending"

    def exception(self) -> BaseException | None:
        return self.error


@dataclass(eq=False, slots=True)
class Flow:
    handle: SimHandle
    src: str
    dst: str
    remaining: float
    rate: float = 0.0
    on_done: Callable[[], None] = field(default=lambda: None)


class SimLink:
    """Processor-sharing flows between engine NICs (the module docstring's model)."""

    def __init__(self, loop: EventLoop, spec: LinkSpec) -> None:
        self.loop = loop
        self.spec = spec
        self.flows: list[Flow] = []
        self._last = 0.0
        self._generation = 0
        self.bytes_moved = 0

    def start(self, flow: Flow) -> None:
        self.loop.after(self.spec.latency_s, lambda: self._enter(flow))

    def _enter(self, flow: Flow) -> None:
        self._advance()
        if flow.remaining <= 0:
            self._finish(flow)
            return
        self.flows.append(flow)
        self._reschedule()

    def _advance(self) -> None:
        elapsed = self.loop.now - self._last
        self._last = self.loop.now
        if elapsed > 0:
            for f in self.flows:
                f.remaining -= f.rate * elapsed

    def _reschedule(self) -> None:
        out: dict[str, int] = {}
        inn: dict[str, int] = {}
        for f in self.flows:
            out[f.src] = out.get(f.src, 0) + 1
            inn[f.dst] = inn.get(f.dst, 0) + 1
        for f in self.flows:
            f.rate = self.spec.bandwidth / max(out[f.src], inn[f.dst])
        self._generation += 1
        if not self.flows:
            return
        gen = self._generation
        wait = min(max(0.0, f.remaining) / f.rate for f in self.flows)
        self.loop.after(wait, lambda: self._on_timer(gen))

    def _on_timer(self, generation: int) -> None:
        if generation != self._generation:
            return  # superseded by a later start/finish
        self._advance()
        # Flows within a byte (or 1e-9 of their size) of the end are done: float residue.
        finished = [f for f in self.flows if f.remaining <= max(1.0, f.handle.nbytes * 1e-9)]
        self.flows = [f for f in self.flows if f not in finished]
        for f in finished:
            self._finish(f)
        self._reschedule()

    def _finish(self, flow: Flow) -> None:
        flow.handle.status = "done"
        self.bytes_moved += flow.handle.nbytes
        flow.on_done()


class SimTransferServer:
    """P's side: which blocks of which request a reader may have; events for the connector."""

    def __init__(self, transport: SimTransport, layout: PageLayout, engine_id: str) -> None:
        self.transport = transport
        self.engine_id = engine_id
        self.descriptor = KVSourceDescriptor(engine_id, "sim", "sim", 1, layout.to_wire())
        self.allowed: dict[str, dict[int, set[int]]] = {}
        self._events: list[SimEvent] = []

    def allow(self, request_id: str, blocks: dict[int, list[int]], lease_deadline: float) -> None:
        self.allowed[request_id] = {g: set(ids) for g, ids in blocks.items()}

    def extend(self, request_id: str, lease_deadline: float) -> None:
        """Leases never expire in virtual time (docs/simulator.md "What is not modelled")."""

    def release(self, request_id: str, wait_s: float = 10.0) -> bool:
        self.allowed.pop(request_id, None)
        return True

    def events(self) -> list[SimEvent]:
        out, self._events = self._events, []
        return out

    def post(self, event: SimEvent) -> None:
        self._events.append(event)
        self.transport.notify(self.engine_id)

    def close(self) -> None:
        self.allowed.clear()


class SimTransferClient:
    """D's side: a read becomes a flow from P's NIC to this engine's."""

    def __init__(self, transport: SimTransport, engine_id: str) -> None:
        self.transport = transport
        self.engine_id = engine_id
        self._done: list[SimHandle] = []
        self._ids = itertools.count()

    def start_read(
        self, source: KVSourceDescriptor, request_id: str, pages: list[PageCopy]
    ) -> SimHandle:
        server = self.transport.servers[source.engine_id]
        nbytes = sum(p.nbytes for p in pages)
        handle = SimHandle(f"{self.engine_id}-{next(self._ids)}", request_id, source, nbytes)
        allowed = server.allowed.get(request_id)
        if allowed is None or any(p.src not in allowed.get(p.group, ()) for p in pages):
            handle.status = "failed"
            handle.error = RuntimeError(f"{request_id}: read refused (blocks not allowed)")
            self._done.append(handle)
            self.transport.notify(self.engine_id)
            return handle

        def finished() -> None:
            self._done.append(handle)
            server.post(SimEvent("read_ok", request_id, nbytes))
            self.transport.notify(self.engine_id)

        flow = Flow(handle, server.engine_id, self.engine_id, float(nbytes), on_done=finished)
        self.transport.link.start(flow)
        return handle

    def completed(self) -> list[SimHandle]:
        out, self._done = self._done, []
        return out

    def release_remote(self, source: KVSourceDescriptor, request_id: str) -> None:
        self.transport.servers[source.engine_id].post(SimEvent("released", request_id))

    def keep_alive(self, source: KVSourceDescriptor, request_id: str) -> None:
        self.transport.servers[source.engine_id].post(SimEvent("keepalive", request_id))

    def close(self) -> None:
        self._done.clear()


class SimTransport(KVTransport):
    """One per simulated cluster: the link, P's servers by engine id, and a wake-up hook
    (`notify(engine_id)`: something for that engine's connector to poll)."""

    name = "sim"
    summary = "simulated link (relaykv sim)"

    def __init__(self, loop: EventLoop, link: LinkSpec, notify: Callable[[str], None]) -> None:
        self.link = SimLink(loop, link)
        self.notify = notify
        self.servers: dict[str, SimTransferServer] = {}

    def sender_plane(self, buffer: Any, layout: PageLayout, options: Any) -> Any:
        raise NotImplementedError("the simulated transport moves no bytes")

    def receiver_plane(self, buffer: Any, layout: PageLayout, options: Any) -> Any:
        raise NotImplementedError("the simulated transport moves no bytes")

    def create_server(  # type: ignore[override]
        self, buffer: Any, layout: PageLayout, *, engine_id: str, **_: Any
    ) -> SimTransferServer:
        server = SimTransferServer(self, layout, engine_id)
        self.servers[engine_id] = server
        return server

    def create_client(  # type: ignore[override]
        self, buffer: Any, layout: PageLayout, *, engine_id: str, **_: Any
    ) -> SimTransferClient:
        return SimTransferClient(self, engine_id)
