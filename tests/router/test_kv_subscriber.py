"""Following a real publisher: late join, gaps, lost batches, the engine going away."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
import zmq

from relaykv.common.messages.kv_events import seq_frame
from relaykv.common.plumbing.derived_keys import CurveKeys
from relaykv.engine.kv_events import ZmqEventPublisher
from relaykv.engine.kv_events_config import KVEventsConfig
from relaykv.kvcache import KVEvent
from relaykv.router.index import EngineIndex
from relaykv.router.kv_subscriber import EventSubscriber
from tests.kvcache.conftest import geometry

GEO = geometry("full:16", "sliding:16:32")


def _publisher(
    buffer_steps: int = 10_000, host: str = "127.0.0.1", secret: bytes | None = None
) -> ZmqEventPublisher:
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"tcp://{host}:*",
        replay_endpoint=f"tcp://{host}:*",
        buffer_steps=buffer_steps,
    )
    return ZmqEventPublisher(config, GEO, secret=secret)


def _store(pub: ZmqEventPublisher, n: int, group: int = 0, tag: bytes = b"k") -> list[bytes]:
    """Publish n batches of one stored key each (waiting so each is its own batch)."""
    keys = []
    for i in range(n):
        key = tag + i.to_bytes(15, "big")
        before = pub.published
        pub.sink(KVEvent("stored", group, (key,)))
        deadline = time.monotonic() + 2
        while pub.published == before and time.monotonic() < deadline:
            time.sleep(0.002)
        keys.append(key)
    return keys


async def _until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_late_subscriber_replays_then_follows_live() -> None:
    pub = _publisher()
    index = EngineIndex(GEO)
    early = _store(pub, 5)
    sub = EventSubscriber(index, pub.endpoint, pub.replay_endpoint)
    sub.start()
    try:
        await _until(lambda: index.expected == 5)  # replayed on connect, with the engine idle
        late = await asyncio.to_thread(_store, pub, 3, 1, b"s")
        await _until(lambda: index.expected == 8)
        assert set(index.maps[0]) == set(early) and set(index.maps[1]) == set(late)
        assert index.gaps == 0
    finally:
        await sub.stop()
        pub.shutdown()


async def test_gap_is_filled_by_replay_or_the_index_resets() -> None:
    pub = _publisher(buffer_steps=3)
    index = EngineIndex(GEO)
    sub = EventSubscriber(index, pub.endpoint, pub.replay_endpoint)
    keys = _store(pub, 6)  # batches 0..5; the publisher keeps only 3..5
    # A subscriber that saw batch 0 and then missed some: the lost ones cannot be replayed.
    index.expected = 1
    index.maps[0][keys[0]] = 1
    seq, payload = pub._buffer[-1]
    await sub._on_batch(seq, payload)
    assert index.resets == 1 and set(index.maps[0]) == {keys[5]} and index.expected == 6
    # A gap the buffer still covers is filled in order.
    index.reset()
    index.expected = 3
    await sub._on_batch(seq, payload)
    assert set(index.maps[0]) == set(keys[3:]) and index.expected == 6
    assert sub.replays == 2
    await sub.stop()
    pub.shutdown()


async def test_engine_going_away_drops_the_index_and_reports_down() -> None:
    pub = _publisher()
    index = EngineIndex(GEO)
    downs: list[str] = []
    sub = EventSubscriber(index, pub.endpoint, pub.replay_endpoint, on_down=downs.append)
    sub.start()
    try:
        await _until(lambda: sub.connected)
        await asyncio.to_thread(_store, pub, 2)
        await _until(lambda: index.num_blocks == 2)
        t0 = time.monotonic()
        pub.shutdown()  # the sockets close, as when the process dies
        await _until(lambda: bool(downs), timeout=2.0)
        assert time.monotonic() - t0 < 2.0
        assert index.num_blocks == 0 and not sub.connected
    finally:
        await sub.stop()


SECRET = b"a" * 64


def _local(endpoint: str) -> str:
    return endpoint.replace("0.0.0.0", "127.0.0.1")


async def test_off_host_stream_is_curve_only_the_clusters_subscriber_reads_it() -> None:
    """An endpoint off the host (0.0.0.0) is a CURVE server: the router's subscriber with the
    cluster's keys replays and follows it. A plain SUB and a plain replay request get nothing;
    a CURVE client that knows the publisher's public key (it is no secret) but holds its own
    key pair gets nothing either: the ZAP handler refuses its key, on both sockets."""
    pub = _publisher(host="0.0.0.0", secret=SECRET)
    assert pub.describe()["curve"] is True
    endpoint, replay = _local(pub.endpoint), _local(str(pub.replay_endpoint))
    early = await asyncio.to_thread(_store, pub, 3)
    index, stranger_index = EngineIndex(GEO), EngineIndex(GEO)
    sub = EventSubscriber(index, endpoint, replay, curve=CurveKeys.from_secret(SECRET))
    cluster = CurveKeys.from_secret(SECRET)
    own = CurveKeys.from_secret(b"b" * 64)
    knows_public = dataclasses.replace(own, server_public=cluster.server_public)
    stranger = EventSubscriber(stranger_index, endpoint, replay, curve=knows_public)
    ctx = zmq.Context()
    plain = ctx.socket(zmq.SUB)
    plain.setsockopt(zmq.SUBSCRIBE, b"")
    plain.connect(endpoint)
    ask = ctx.socket(zmq.DEALER)
    ask.connect(replay)
    ask.send_multipart((b"", seq_frame(0)))
    sub.start()
    stranger.start()
    try:
        await _until(lambda: index.expected == 3)
        late = await asyncio.to_thread(_store, pub, 2, 1, b"s")
        await _until(lambda: index.expected == 5)
        assert set(index.maps[0]) == set(early) and set(index.maps[1]) == set(late)
        await _until(lambda: pub._zap is not None and pub._zap.refused >= 2)
        assert stranger_index.batches == 0 and stranger_index.num_blocks == 0
        assert not plain.poll(300) and not ask.poll(300)
    finally:
        plain.close(0)
        ask.close(0)
        ctx.term()
        await sub.stop()
        await stranger.stop()
        pub.shutdown()


def test_off_host_stream_needs_the_secret() -> None:
    with pytest.raises(ValueError, match="cluster secret"):
        _publisher(host="0.0.0.0")
    assert _publisher().describe()["curve"] is False  # loopback: vLLM's plain wire


async def test_a_curve_engine_is_followed_only_with_the_cluster_secret(caplog) -> None:
    """An engine reporting a CURVE stream: a router with the secret subscribes with the
    derived keys; one without routes that engine on load alone and says why."""
    from relaykv.common.messages.geometry_json import geometry_json
    from relaykv.router.backends import Backend
    from relaykv.router.engines import Engines
    from relaykv.router.holders import KeyHolders

    pub = _publisher(host="0.0.0.0", secret=SECRET)
    info = {"instance": "i1", "geometry": geometry_json(GEO), "role": "decode",
            "kv_events": {**pub.describe(), "endpoint": _local(pub.endpoint),
                          "replay_endpoint": _local(str(pub.replay_endpoint))}}
    with_secret = Engines(KeyHolders(), follow_events=True, kv_secret=SECRET)
    without = Engines(KeyHolders(), follow_events=True)
    backend = Backend("http://127.0.0.1:1", "decode")
    try:
        keys = await asyncio.to_thread(_store, pub, 2)
        await with_secret._follow(with_secret.tracker(backend), backend, info)
        t = with_secret.tracker(backend)
        assert t.subscriber is not None and t.subscriber.curve == CurveKeys.from_secret(SECRET)
        index = t.index
        assert index is not None
        await _until(lambda: set(index.maps[0]) == set(keys))
        await without._follow(without.tracker(backend), backend, info)
        assert without.tracker(backend).subscriber is None
        assert "no cluster secret (--kv-secret-file)" in caplog.text
    finally:
        await with_secret.stop()
        pub.shutdown()
