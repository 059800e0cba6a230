"""The P/D connector's quarantine and keep-alives on an injected clock: no sleeps, no races.

A fake transport client stands in for the wire (what it reports is what the test says), and a
`ManualClock` is moved by hand, so "not before the quarantine ends" and "every third of the
lease" are checked exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relaykv.common.messages.steps import SamplingParams
from relaykv.engine.request import Request
from relaykv.kvcache import CacheRole, Geometry, GroupSpec, KVCacheManager
from relaykv.transfer.connector import PDConnector
from relaykv.transfer.transport import KVSourceDescriptor, PageLayout
from tests.waiting import ManualClock

GEO = Geometry(
    (GroupSpec("full", 4, bytes_per_token=8), GroupSpec("sliding", 4, window=8, bytes_per_token=8))
)


class _PushFailure(Exception):
    dst_quiesced = False  # a push transport may still be writing into D's pages


@dataclass
class _Handle:
    transfer_id: str
    request_id: str
    source: KVSourceDescriptor
    status: str = "pending"
    error: Exception | None = None

    def exception(self) -> Exception | None:
        return self.error


@dataclass
class _Client:
    handles: list[_Handle] = field(default_factory=list)
    finished: list[_Handle] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    keep_alives: list[str] = field(default_factory=list)

    def start_read(self, source: KVSourceDescriptor, request_id: str, pages: Any) -> _Handle:
        handle = _Handle(f"t{len(self.handles)}", request_id, source)
        self.handles.append(handle)
        return handle

    def completed(self) -> list[_Handle]:
        done, self.finished = self.finished, []
        return done

    def release_remote(self, source: KVSourceDescriptor, request_id: str) -> None:
        self.released.append(request_id)

    def keep_alive(self, source: KVSourceDescriptor, request_id: str) -> None:
        self.keep_alives.append(request_id)

    def close(self) -> None:
        pass


class _Transport:
    def __init__(self) -> None:
        self.client = _Client()

    def create_client(self, buffer: Any, layout: PageLayout, **kw: Any) -> _Client:
        return self.client


def _decode_side(clock: ManualClock) -> tuple[PDConnector, KVCacheManager, _Client]:
    manager = KVCacheManager(GEO, 64, pd_role=True)
    transport = _Transport()
    connector = PDConnector(
        "decode",
        manager,
        transport,  # type: ignore[arg-type]
        None,
        engine_id="D",
        lease_seconds=9.0,
        quarantine_seconds=5.0,
        clock=clock,
    )
    return connector, manager, transport.client


def _remote_request(manager: KVCacheManager, rid: str) -> Request:
    source = KVSourceDescriptor(
        "P", "fake", "127.0.0.1", 1, PageLayout.from_geometry(GEO, 64).to_wire()
    )
    prompt = list(range(40))
    params = {
        "do_remote_prefill": True,
        "remote_request_id": rid,
        "source": source.to_dict(),
        "remote_num_tokens": len(prompt),
        "pd_policy": str(manager.pd_policy),
        "lease_seconds": 9.0,
        "remote_block_ids": [[[k, 100 + k] for k in range(10)], [[k, 200 + k] for k in range(10)]],
    }
    req = Request(rid, prompt, SamplingParams(), kv_transfer_params=params)
    req.cache = manager.add_request(rid, prompt, role=CacheRole.DECODE)
    return req


def test_a_failed_push_is_quarantined_until_its_deadline() -> None:
    clock = ManualClock()
    connector, manager, client = _decode_side(clock)
    req = _remote_request(manager, "r1")
    load = manager.receive(req.cache)
    assert load is not None and load.needs_transfer
    connector.start_load(req, load)
    handle = client.handles[0]
    handle.status, handle.error = "failed", _PushFailure("peer died")
    client.finished.append(handle)
    assert connector.poll() == []  # D's pages may still be written: the load stays pending
    assert client.released == ["r1"]  # but P may free its blocks now
    clock.advance(4.999)
    assert connector.poll() == [] and load.pending
    clock.advance(0.001)
    assert connector.poll() == [(load, False)]
    assert connector.poll() == []  # reported once, then forgotten
    assert manager.load_finished(load, ok=False) == [load]
    assert connector.check() == []


def test_keep_alives_every_third_of_the_lease() -> None:
    clock = ManualClock()
    connector, manager, client = _decode_side(clock)
    waiting = [_remote_request(manager, "w1")]
    connector.keep_alive(waiting)  # first sight: starts the count
    clock.advance(2.9)
    connector.keep_alive(waiting)
    assert client.keep_alives == []
    clock.advance(0.1)  # 3.0 s = lease / 3
    connector.keep_alive(waiting)
    assert client.keep_alives == ["w1"]
    clock.advance(2.0)
    connector.keep_alive(waiting)
    assert client.keep_alives == ["w1"]
    connector.keep_alive([])  # no longer waiting: forgotten
    assert connector._kept_alive == {}
