"""Fixtures for the transport conformance suite: every transport, in one process (two
buffers) and across processes (a standalone serving process)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from relaykv.transfer.transport import (
    FaultPlan,
    KVSourceDescriptor,
    PageLayout,
    TransferClient,
    TransportOptions,
    get_transport,
)
from relaykv.transfer.transport.planes.shm import SharedKVBuffer
from relaykv.transfer.transport.registry import TRANSPORT_NAMES, transport_class
from relaykv.transfer.transport.serving.standalone import StandalonePeer, seeded_buffer

# Three groups with different page sizes in one buffer (one of them odd-sized), so a
# page is never a whole row and row padding must stay untouched.
LAYOUT = PageLayout(num_blocks=64, block_bytes=8192, page_bytes=(8192, 3072, 1000))
SEED = 1234
# small chunks so that a read of a few pages already spans several chunks and credits
OPTIONS = TransportOptions(
    chunk_bytes=16384, window=2, timeout_s=10.0, connect_timeout_s=2.0, staging_bytes=16384 * 8
)


def transport_params(variants: bool = False) -> list[Any]:
    """Every transport; with `variants`, also shm in direct mode (D's buffer shared)."""
    names = [*TRANSPORT_NAMES, *(["shm:direct"] if variants else [])]
    params = []
    for name in names:
        reason = transport_class(name.split(":")[0]).availability()
        marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@dataclass
class Source:
    """The serving side as a test sees it, in-process or in another process."""

    descriptor: KVSourceDescriptor
    src: np.ndarray  # the bytes the server serves (regenerated for a subprocess)
    backend: Any  # TransferServer or StandalonePeer

    @property
    def remote(self) -> bool:
        return isinstance(self.backend, StandalonePeer)

    def allow(self, request_id: str, blocks: dict[int, list[int]], lease_s: float = 30.0) -> None:
        if self.remote:
            self.backend.allow(request_id, blocks, lease_s)
        else:
            self.backend.allow(request_id, blocks, time.monotonic() + lease_s)

    def release(self, request_id: str) -> None:
        if self.remote:
            self.backend.call("release", request_id=request_id)
        else:
            self.backend.release(request_id)

    def inject(self, plan: FaultPlan | None) -> None:
        if self.remote:
            fields = None
            if plan is not None:
                fields = {k: getattr(plan, k) for k in plan.__slots__}
                if fields["request_ids"] is not None:
                    fields["request_ids"] = sorted(fields["request_ids"])
            self.backend.call("inject", faults=fields)
        else:
            self.backend.inject(plan)

    def events(self) -> list[dict[str, Any]]:
        if self.remote:
            return self.backend.call("events")
        return [
            {"kind": e.kind, "request_id": e.request_id, "nbytes": e.nbytes, "detail": e.detail}
            for e in self.backend.events()
        ]

    def check_invariants(self) -> None:
        if not self.remote:
            self.backend.check_invariants()


@dataclass
class Pair:
    source: Source
    client: TransferClient
    dst: np.ndarray
    transport: str
    push: bool  # P writes D's pages itself (nixl, mooncake, shm direct)


@pytest.fixture(scope="module", params=transport_params(variants=True))
def transport_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module", params=["inproc", "subproc"])
def pair_module(request: pytest.FixtureRequest, transport_name: str) -> Iterator[Pair]:
    name, _, variant = transport_name.partition(":")
    transport = get_transport(name)
    src = seeded_buffer(LAYOUT, SEED)
    if request.param == "inproc":
        server = transport.create_server(src, LAYOUT, engine_id="P-test", options=OPTIONS)
        source = Source(server.descriptor, src, server)
    else:
        peer = StandalonePeer(name, LAYOUT, seed=SEED, chunk_bytes=OPTIONS.chunk_bytes)
        source = Source(peer.descriptor, src, peer)
    shared = SharedKVBuffer(LAYOUT) if variant == "direct" else None
    if shared is not None:
        dst = shared.array
    else:
        dst = np.zeros((LAYOUT.num_blocks, LAYOUT.block_bytes), dtype=np.uint8)
    client = transport.create_client(dst, LAYOUT, engine_id="D-test", options=OPTIONS)
    push = name in ("nixl", "mooncake") or shared is not None
    try:
        yield Pair(source, client, dst, transport_name, push)
    finally:
        client.close()
        source.backend.close()
        if shared is not None:
            shared.close()


@pytest.fixture
def pair(pair_module: Pair) -> Iterator[Pair]:
    """A clean pair for one test: zeroed destination, no faults, invariants checked after."""
    pair_module.dst[:] = 0
    pair_module.source.inject(None)
    pair_module.source.events()  # drop what earlier tests left
    yield pair_module
    pair_module.source.inject(None)
    pair_module.client.check_invariants()
    pair_module.source.check_invariants()
