"""The KV event publisher: the pool's events on vLLM's wire format (docs/kv-events.md).

The cache manager calls `sink(event)` from the engine thread for every change to what the
pool can serve; the sink turns it into a vLLM event (one event per group, tagged with the
group's index and kind) and queues it. A publisher thread gathers what is queued into one
`KVEventBatch` `[ts, events, data_parallel_rank]`, numbers it, sends the multipart message
`(topic, 8-byte big-endian sequence number, msgpack payload)` on a ZMQ PUB socket and keeps
the last `buffer_steps` batches for the replay ROUTER socket, which answers a request
`(identity, b"", start_seq)` with every kept batch from `start_seq` on, then `(-1, b"")`,
exactly as vLLM's `ZmqEventPublisher` does. The records and frames are the floor's
(`relaykv.common.messages.kv_events`), which the router decodes with.

Who can read it (docs/security.md, "Listeners"): an `ipc://` socket only processes that can
enter its directory (`relaykv up` puts it in its private 0700 runtime directory); a loopback
tcp socket every local user (vLLM's plain wire, for vLLM's consumers); a stream with an
endpoint off the host (`KVEventsConfig.curve`) only the cluster: both sockets are CURVE
servers with keys derived from the cluster secret, and a ZAP handler admits only the
cluster's subscriber key (`relaykv.common.plumbing.derived_keys`).

Ordering and loss: events are numbered in the order the pool emitted them; nothing is dropped
before it is numbered (when `max_queue_size` events wait, the engine thread waits), so a gap
in sequence numbers can only come from the PUB socket's high-water mark or the network, and
replay fills it while the batch is still buffered.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any

import zmq

from relaykv.common.messages.kv_events import (
    END_SEQ,
    MEDIUM_GPU,
    SEQ_BYTES,
    VLLM_SPEC_KIND,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireEvent,
    batch_encoder,
    frame_seq,
    seq_frame,
)
from relaykv.common.plumbing.derived_keys import ClusterOnlyZap, CurveKeys
from relaykv.engine.kv_events_config import KVEventsConfig, binds, loopback_default
from relaykv.kvcache import Geometry, KVEvent

log = logging.getLogger("relaykv.serve")

# The publisher thread sleeps until the engine queues an event (`sink` wakes it) or _IDLE_S
# passes (how long a replay request can wait on an idle engine); after a wake-up it lets
# _BATCH_S of a step's events gather so they go out as one batch. An idle engine no longer
# polls at 500 Hz (several % of a core per engine on a shared host).
_IDLE_S = 0.05
_BATCH_S = 0.002


def spec_kind(geometry: Geometry, group: int) -> tuple[str, int | None]:
    """vLLM's `kv_cache_spec_kind` and sliding window of a group."""
    spec = geometry.groups[group]
    return VLLM_SPEC_KIND[spec.kind], spec.window


def wire_event(event: KVEvent, geometry: Geometry) -> WireEvent:
    """One pool event as one vLLM event (a pool event never spans groups)."""
    if event.kind == "stored":
        kind, window = spec_kind(geometry, event.group)
        return BlockStored(
            block_hashes=list(event.keys),
            parent_block_hash=event.parent,
            token_ids=list(event.token_ids),
            block_size=geometry.groups[event.group].block_size,
            lora_id=None,
            medium=event.medium or MEDIUM_GPU,
            lora_name=None,
            group_idx=event.group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
        )
    if event.kind == "removed":
        return BlockRemoved(
            block_hashes=list(event.keys), medium=event.medium or MEDIUM_GPU, group_idx=event.group
        )
    return AllBlocksCleared()


class ZmqEventPublisher:
    """PUB + replay ROUTER publisher with an in-memory replay buffer (see module docstring)."""

    def __init__(
        self,
        config: KVEventsConfig,
        geometry: Geometry,
        dp_rank: int = 0,
        secret: bytes | None = None,
    ) -> None:
        """`secret`: the cluster secret, required when the config has an off-host endpoint."""
        if config.curve and secret is None:
            raise ValueError("KV events on an address off this host need the cluster secret")
        self.config = config
        self.geometry = geometry
        self.dp_rank = dp_rank
        self.published = 0  # batches sent (the next sequence number)
        self._pending: deque[WireEvent] = deque()
        self._room = threading.Condition()
        self._wakeup = threading.Event()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self._ctx = zmq.Context()
        self._keys = CurveKeys.from_secret(secret) if config.curve and secret else None
        self._zap = ClusterOnlyZap(self._ctx, self._keys) if self._keys else None
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._secure(self._pub)
        self.endpoint = self._open(self._pub, config.endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        if config.replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._secure(self._replay)
            self.replay_endpoint = self._open(self._replay, config.replay_endpoint, bind=True)
        self._running = True
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kv-events")
        self._thread.start()

    def _secure(self, sock: zmq.Socket[bytes]) -> None:
        if self._keys is not None:
            self._keys.serve(sock)

    @staticmethod
    def _open(sock: zmq.Socket[bytes], endpoint: str, bind: bool | None = None) -> str:
        if bind is None:
            bind = binds(endpoint)  # decided on the endpoint as given (vLLM's rule)
        endpoint = loopback_default(endpoint)
        if bind:
            sock.bind(endpoint)
            last = sock.getsockopt(zmq.LAST_ENDPOINT)
            return last.decode() if isinstance(last, bytes) else str(last)
        sock.connect(endpoint)
        return endpoint

    # -- engine thread ---------------------------------------------------------------
    def sink(self, event: KVEvent) -> None:
        """The cache manager's event sink (engine thread): queue the wire event."""
        wire = wire_event(event, self.geometry)
        if len(self._pending) >= self.config.max_queue_size:
            with self._room:
                while len(self._pending) >= self.config.max_queue_size and self._running:
                    self._room.wait(0.1)
        self._pending.append(wire)
        if not self._wakeup.is_set():  # is_set takes no lock; set() does
            self._wakeup.set()

    # -- publisher thread --------------------------------------------------------------
    def _loop(self) -> None:
        encoder = batch_encoder()
        while True:
            self._wakeup.clear()  # before looking: an event queued from here on wakes the wait
            if self._replay is not None and self._replay.poll(0):
                with contextlib.suppress(zmq.ZMQError):
                    self._serve_replay()
            events = self._take()
            if events:
                batch = KVEventBatch(ts=time.time(), events=events, data_parallel_rank=self.dp_rank)
                payload = encoder.encode(batch)
                seq = self.published
                self._pub.send_multipart((self._topic, seq_frame(seq), payload))
                self._buffer.append((seq, payload))
                self.published = seq + 1
            elif not self._running:
                return
            elif self._wakeup.wait(_IDLE_S):
                time.sleep(_BATCH_S)

    def _take(self) -> list[WireEvent]:
        out: list[WireEvent] = []
        pending = self._pending
        while pending and len(out) < 4096:
            out.append(pending.popleft())
        if out:
            with self._room:
                self._room.notify_all()
        return out

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != SEQ_BYTES:
            log.warning("kv events: ignoring a malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        start_seq = frame_seq(start)
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", seq_frame(seq), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    # -- lifecycle -------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": self.config.topic,
            "published": self.published,
            "curve": self._keys is not None,  # subscribe with the cluster's CURVE keys
        }

    def shutdown(self, timeout: float = 2.0) -> None:
        """Publish what is queued (an `AllBlocksCleared` last: the cache goes away), stop."""
        if not self._running:
            return
        self._pending.append(AllBlocksCleared())
        self._running = False
        self._wakeup.set()
        with self._room:
            self._room.notify_all()
        self._thread.join(timeout)
        # What the thread sent may still sit in ZMQ's queue (its IO thread writes it out);
        # a bounded linger lets the last batches, `AllBlocksCleared` among them, reach
        # subscribers that are connected, instead of being dropped by close.
        self._pub.close(linger=int(timeout * 1000))
        if self._replay is not None:
            self._replay.close(0)
        if self._zap is not None:
            self._zap.stop()
        self._ctx.term()
