"""KV events on vLLM's wire format, decoded with an independent schema (docs/kv-events.md).

The schema below is written from vLLM's documented format (`vllm/distributed/kv_events.py`:
an `array_like` `KVEventBatch` `[ts, events, data_parallel_rank]` whose events are tagged
structs, `{"type": "BlockStored", ...}`), not imported from relaykv, so a mistake in the
publisher's encoding cannot cancel out.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from typing import Any

import msgspec
import pytest
import zmq

from relaykv.engine.kv_events import ZmqEventPublisher
from relaykv.engine.kv_events_config import (
    KVEventsConfig,
    KVEventsConfigError,
    off_host,
    parse_kv_events_config,
)
from relaykv.kvcache import KVCacheManager, KVEvent
from tests.kvcache.conftest import Driver, geometry, tokens


# -- the independent schema (vLLM's kv_events.py, as documented) --------------------------
class VBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(VEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(VEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(VEvent):
    pass


class VKVEventBatch(VBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(VKVEventBatch)


def _config(**kw: Any) -> KVEventsConfig:
    base = dict(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic="kv",
    )
    return KVEventsConfig(**{**base, **kw})


def _workload(manager: KVCacheManager, seed: int = 0) -> None:
    """Shared-prefix requests through a small pool: stores, evictions, sliding frees."""
    rng = random.Random(seed)
    d = Driver(manager)
    systems = [tokens(96, seed=s) for s in range(4)]
    for i in range(24):
        prompt = systems[rng.randrange(4)] + tokens(rng.randrange(8, 70), seed=100 + i)
        req, _ = d.prefill(prompt, chunk=32)
        d.decode(req, rng.randrange(1, 20))
        d.finish(req)


def _receive(sub: zmq.Socket, until_seq: int, timeout: float = 60.0) -> list[tuple[int, bytes]]:
    """Batches from `sub` until one numbered `until_seq` arrives (the timeout bounds a broken
    run only: a passing run returns as soon as that batch is in)."""
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    while not out or out[-1][0] < until_seq:
        assert time.monotonic() < deadline, f"batch {until_seq} did not arrive in {timeout}s"
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv" and len(seq) == 8
            out.append((int.from_bytes(seq, "big"), payload))
    return out


FENCE = b"fence:"  # the keys of marker events (no pool holds them)
_markers = itertools.count()


def _fence(publisher: ZmqEventPublisher, sub: zmq.Socket) -> list[tuple[int, bytes]]:
    """Publish a marker event (the removal of a key no pool holds) and receive up to and
    including the batch that carries it: events go out in the order they were queued, so
    every event queued before the marker is in the returned batches. A SUB socket's
    subscription reaches the PUB side asynchronously and PUB drops what it sends before, so
    while nothing has arrived yet the fence queues a new marker every 0.2 s; it returns with
    the batch of the last one queued (once one arrives all later ones do), so no marker
    follows the fence. No sleep that a loaded machine can outlast."""
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    marker = b""
    while True:
        if not out:
            assert time.monotonic() < deadline, "the subscription never went live"
            marker = FENCE + next(_markers).to_bytes(8, "big")
            publisher.sink(KVEvent("removed", 0, (marker,)))
        waited = time.monotonic() + 0.2
        while out or time.monotonic() < waited:
            assert time.monotonic() < deadline, "the fence's batch never arrived"
            if not sub.poll(20):
                continue
            topic, seq_bytes, payload = sub.recv_multipart()
            assert topic == b"kv" and len(seq_bytes) == 8
            out.append((int.from_bytes(seq_bytes, "big"), payload))
            if _carries(payload, marker):
                return out


def _carries(payload: bytes, key: bytes) -> bool:
    return any(
        isinstance(ev, BlockRemoved) and key in map(bytes, ev.block_hashes)
        for ev in DECODER.decode(payload).events
    )


def _replay(ctx: zmq.Context, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    dealer = ctx.socket(zmq.DEALER)  # a REQ socket would take only the first reply
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    out = []
    try:
        dealer.send_multipart((b"", start.to_bytes(8, "big")))
        while True:
            assert dealer.poll(5000), "replay timed out"
            empty, seq_bytes, payload = dealer.recv_multipart()
            assert empty == b""
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == -1:
                return out
            out.append((seq, payload))
    finally:
        dealer.close(0)


def _as_log(batches: list[tuple[int, bytes]]) -> Counter[tuple[str, int, bytes]]:
    seen: Counter[tuple[str, int, bytes]] = Counter()
    for _, payload in batches:
        batch = DECODER.decode(payload)
        assert batch.data_parallel_rank == 0
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                assert ev.group_idx is not None and ev.medium == "GPU"
                seen.update(("stored", ev.group_idx, bytes(h)) for h in ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                seen.update(
                    ("removed", ev.group_idx, bytes(h))
                    for h in ev.block_hashes
                    if not bytes(h).startswith(FENCE)  # the test's markers (`_fence`)
                )
            else:
                seen[("cleared", -1, b"")] += 1
    return seen


def test_every_block_of_every_group_once_no_gaps_and_late_replay() -> None:
    geo = geometry("full:16", "sliding:16:32", draft=1)
    manager = KVCacheManager(geo, 40)
    publisher = ZmqEventPublisher(_config(), geo)
    pool_log: list[KVEvent] = []

    def tee(event: KVEvent) -> None:
        pool_log.append(event)
        publisher.sink(event)

    manager.set_event_sink(tee)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(publisher.endpoint)
    try:
        first = _fence(publisher, sub)[-1][0] + 1  # the subscription is live from here on
        _workload(manager)
        assert manager.pool.evictions > 0
        live = _fence(publisher, sub)  # every workload event has been published and received
        assert [s for s, _ in live] == list(range(first, first + len(live)))  # no gaps

        expected: Counter[tuple[str, int, bytes]] = Counter()
        for e in pool_log:
            expected.update((e.kind, e.group, k) for k in e.keys)
        got = _as_log(live)
        assert got == expected
        # Per group and key the stream alternates stored, removed, stored, ...: each life of
        # a block is announced once and its eviction once.
        life: dict[tuple[int, bytes], str] = {}
        for _, payload in live:
            for ev in DECODER.decode(payload).events:
                kind = "stored" if isinstance(ev, BlockStored) else "removed"
                for h in ev.block_hashes:
                    if bytes(h).startswith(FENCE):
                        continue
                    key = (ev.group_idx, bytes(h))
                    assert life.get(key, "removed") != kind, (kind, key)
                    life[key] = kind
        stored_groups = {g for kind, g, _ in got if kind == "stored"}
        assert stored_groups == {0, 1}

        # Replaying the stream into per-group sets gives exactly what the pool holds.
        held: list[set[bytes]] = [set(), set()]
        for _, payload in live:
            for ev in DECODER.decode(payload).events:
                if isinstance(ev, BlockStored):
                    held[ev.group_idx].update(bytes(h) for h in ev.block_hashes)
                    assert ev.block_size == 16
                    assert len(ev.token_ids) == 16 * len(ev.block_hashes)
                    kind = ev.kv_cache_spec_kind
                    assert kind == ("full_attention" if ev.group_idx == 0 else "sliding_window")
                    assert ev.kv_cache_spec_sliding_window == (None if ev.group_idx == 0 else 32)
                elif isinstance(ev, BlockRemoved):
                    held[ev.group_idx] -= {bytes(h) for h in ev.block_hashes}
        assert held == [set(m) for m in manager.pool.maps]

        # A subscriber that connects late gets what it missed through the replay socket.
        assert publisher.replay_endpoint is not None
        replayed = _replay(ctx, publisher.replay_endpoint, 0)
        assert replayed[first:] == live and [s for s, _ in replayed] == list(range(len(replayed)))
        mid = len(live) // 2  # a start past the first batches: only what follows comes back
        assert _replay(ctx, publisher.replay_endpoint, live[mid][0]) == live[mid:]
    finally:
        sub.close(0)
        ctx.term()
        publisher.shutdown()


def test_token_ids_and_parent_chain_match_the_request() -> None:
    geo = geometry("full:16")
    manager = KVCacheManager(geo, 64)
    log: list[KVEvent] = []
    manager.set_event_sink(log.append)
    prompt = tokens(70)
    req, _ = Driver(manager).prefill(prompt, chunk=32)
    stored = [e for e in log if e.kind == "stored"]
    assert [k for e in stored for k in e.keys] == req.keys(0)[:4]
    assert [t for e in stored for t in e.token_ids] == prompt[:64]
    assert stored[0].parent is None
    assert stored[1].parent == req.keys(0)[len(stored[0].keys) - 1]


def test_shutdown_publishes_all_blocks_cleared_and_encoding_is_vllm_shaped() -> None:
    geo = geometry("full:16")
    publisher = ZmqEventPublisher(_config(replay_endpoint=None), geo)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    _fence(publisher, sub)
    publisher.sink(KVEvent("removed", 0, (b"x" * 16,)))
    publisher.shutdown()  # sends what is queued, then `AllBlocksCleared`, before it closes
    frames = _receive(sub, publisher.published - 1)
    sub.close(0)
    ctx.term()
    raw = [msgspec.msgpack.decode(p) for _, p in frames]
    events = [e for batch in raw for e in batch[1]]
    assert all(isinstance(b, list) and len(b) == 3 for b in raw)  # [ts, events, dp_rank]
    assert events[0] == {
        "type": "BlockRemoved",
        "block_hashes": [b"x" * 16],
        "medium": "GPU",
        "group_idx": 0,
    }
    assert events[-1] == {"type": "AllBlocksCleared"}


def test_config_keys_defaults_and_errors() -> None:
    assert parse_kv_events_config(None) == KVEventsConfig()
    c = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert c.publisher == "zmq" and c.endpoint == "tcp://*:5557" and c.buffer_steps == 10_000
    assert c.hwm == 100_000 and c.max_queue_size == 100_000 and c.topic == "" and c.active
    assert not parse_kv_events_config('{"enable_kv_cache_events": false}').active
    for bad, words in (
        ("[1]", "JSON object"),
        ("{", "not valid JSON"),
        ('{"nope": 1}', "unknown key 'nope'"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"hwm": 0}', "hwm"),
        ('{"endpoint": "http://x"}', "endpoint"),
    ):
        with pytest.raises(KVEventsConfigError, match=words) as info:
            parse_kv_events_config(bad)
        assert "--kv-events-config" in str(info.value)


def test_default_endpoint_binds_loopback() -> None:
    publisher = ZmqEventPublisher(
        _config(endpoint="tcp://*:0", replay_endpoint=None), geometry("full:16")
    )
    try:
        assert publisher.endpoint.startswith("tcp://127.0.0.1:")
    finally:
        publisher.shutdown()


def test_only_endpoints_off_the_host_need_curve() -> None:
    """Loopback tcp stays vLLM's plain wire (for vLLM's consumers on this host); ipc is
    guarded by its directory; an address other hosts reach is CURVE (docs/kv-events.md)."""
    for endpoint in ("tcp://*:5557", "tcp://*:*", "tcp://127.0.0.1:1", "tcp://localhost:2",
                     "tcp://[::1]:3", "ipc:///run/x/events", "inproc://events"):
        assert not off_host(endpoint), endpoint
        assert not _config(endpoint=endpoint, replay_endpoint=None).curve
    for endpoint in ("tcp://0.0.0.0:1", "tcp://[::]:2", "tcp://10.0.0.1:3", "tcp://host-a:4"):
        assert off_host(endpoint), endpoint
        assert _config(endpoint="tcp://*:5557", replay_endpoint=endpoint).curve
def test_tier_events_carry_the_tier_medium() -> None:
    """A KV tier's events name it in `medium` (vLLM's convention: CPU for host memory); the
    device pool's stay GPU (docs/tier.md)."""
    from relaykv.engine.kv_events import wire_event
    from relaykv.kvcache import KVCacheManager
    from relaykv.kvcache.tier import InstantTier
    from tests.kvcache.conftest import geometry, tokens

    geo = geometry("full:16", "sliding:16:64")
    seen: list = []  # the cache's KVEvents
    cache = KVCacheManager(geo, 40, tier=InstantTier(100), on_event=seen.append)
    req = cache.add_request("a", tokens(100))
    assert cache.admit(req, 100) is not None
    cache.commit(req, 100)
    cache.release(req)
    cache.tier_poll()
    media = {wire_event(e, geo).medium for e in seen if e.kind == "stored"}
    assert media == {"GPU", "CPU"}
    tier_keys = {k for e in seen if e.medium == "CPU" for k in e.keys}
    assert cache.tier is not None and tier_keys == {k for m in cache.tier.index.maps for k in m}
