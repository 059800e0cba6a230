"""Following one engine's KV events into its `EngineIndex` (docs/routing.md "Faults").

A SUB socket receives `(topic, seq, payload)`; a DEALER socket asks the engine's replay
ROUTER for missed batches (`(b"", start_seq)` -> `(b"", seq, payload)`... `(b"", -1, b"")`).
A socket monitor reports the TCP connection: when the engine goes away (a crash closes its
sockets at once) the index is dropped and `on_down` is called, so the router stops choosing
the engine before its next health check; when the connection comes back the index starts
empty and is rebuilt from a replay from 0 (a late or reconnected subscriber sees everything
the publisher still buffers; if it buffers less, the index keeps only what later events prove).
A publisher off the engine's host is a CURVE server: both sockets then connect as the
cluster's CURVE client (`relaykv.common.plumbing.derived_keys`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from relaykv.common.messages.kv_events import SEQ_BYTES, frame_seq, seq_frame
from relaykv.common.plumbing.derived_keys import CurveKeys
from relaykv.router.index import EngineIndex

log = logging.getLogger(__name__)

REPLAY_TIMEOUT_S = 2.0


class EventSubscriber:
    def __init__(
        self,
        index: EngineIndex,
        endpoint: str,
        replay_endpoint: str | None,
        topic: str = "",
        on_down: Callable[[str], None] | None = None,
        on_up: Callable[[], None] | None = None,
        curve: CurveKeys | None = None,
    ) -> None:
        """`curve`: the cluster's subscriber keys, for a publisher off its host."""
        self.index = index
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.on_down = on_down
        self.on_up = on_up
        self.curve = curve
        self.connected = False
        self.replays = 0
        self._ctx = zmq.asyncio.Context()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
                await self._task
        self._ctx.term()

    async def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.RECONNECT_IVL, 200)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        if self.curve is not None:
            self.curve.connect_as_client(sub)
        sub.connect(self.endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if self._on_monitor(event) and self.replay_endpoint:
                        self.index.expected = 0  # everything the publisher still buffers
                        await self._replay(0)
                if sub in ready:
                    frames = await sub.recv_multipart()
                    if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
                        self.index.events_dropped += 1
                        continue
                    await self._on_batch(frame_seq(frames[1]), frames[2])
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    def _on_monitor(self, event: Mapping[str, Any]) -> bool:
        """Track the connection; True when it has just been (re)established."""
        if event["event"] == zmq.EVENT_DISCONNECTED and self.connected:
            self.connected = False
            self.index.reset()
            if self.on_down is not None:
                self.on_down("KV event stream disconnected")
        elif event["event"] == zmq.EVENT_CONNECTED and not self.connected:
            self.connected = True
            self.index.reset()  # a fresh (or restarted) engine: rebuild from its events
            if self.on_up is not None:
                self.on_up()
            return True
        return False

    async def _on_batch(self, seq: int, payload: bytes) -> None:
        index = self.index
        if index.expected is None and seq > 0 and self.replay_endpoint:
            # Joining late (or after a reconnect): fetch what was published before.
            index.expected = 0
            await self._replay(0)
        if index.accept(seq, payload):
            return
        # A gap: ask for the missing batches; if they are gone, start over from here.
        await self._replay(index.expected or 0)
        if not index.accept(seq, payload):
            log.warning(
                "KV events %s: batches %s..%s lost; index reset",
                self.endpoint,
                index.expected,
                seq - 1,
            )
            index.reset()
            index.accept(seq, payload)

    async def _replay(self, start: int) -> None:
        if not self.replay_endpoint:
            return
        self.replays += 1
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            self.curve.connect_as_client(dealer)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart((b"", seq_frame(start)))
            while await dealer.poll(int(REPLAY_TIMEOUT_S * 1000)):
                frames = await dealer.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = frame_seq(frames[1], signed=True)
                if seq < 0:
                    return
                if not self.index.accept(seq, frames[2]):
                    return  # the publisher no longer has the batch we need next
        finally:
            dealer.close(0)
