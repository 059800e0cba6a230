"""The engine for servers: the step loop on its own thread, outputs streamed per request.

Commands (add, abort) go to the engine thread through a queue and are applied between steps,
so the engine itself is single-threaded. Outputs come back to the event loop with
`call_soon_threadsafe` into one `asyncio.Queue` per request. A consumer that stops iterating
(a client disconnect cancels it) aborts its request, which frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from relaykv.common.messages.steps import InvalidRequest, SamplingParams
from relaykv.engine.engine import LLMEngine
from relaykv.engine.request import RequestOutput

log = logging.getLogger(__name__)

MAX_STEP_FAILURES = 3  # consecutive failed steps before the engine is declared dead


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, idle_wait: float = 0.05) -> None:
        self.engine = engine
        self.idle_wait = idle_wait
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.accepting = True
        self.dead: BaseException | None = None
        self._failures = 0

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="relaykv-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, drain_timeout: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish (up to a timeout), abort the rest."""
        self.accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._queues and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for request_id in list(self._queues):
            self.abort(request_id)
        deadline = time.monotonic() + 5
        while self._queues and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        connector = self.engine.connector
        if connector is not None:
            connector.shutdown()
        tier = self.engine.manager.tier
        if tier is not None:
            tier.shutdown()  # a shared store's client unmounts this engine's memory

    @property
    def num_active(self) -> int:
        return len(self._queues)

    # -- requests ----------------------------------------------------------------------
    async def generate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. Raises `InvalidRequest` before the first output for
        anything the engine refuses, and `EngineDeadError` if the engine has stopped."""
        if self.dead is not None or self._stopping:
            raise EngineDeadError("the engine is not running")
        if not self.accepting:
            raise EngineDeadError("the engine is shutting down")
        if request_id in self._queues:
            raise InvalidRequest("request_id", f"request id {request_id!r} is already running")
        self.engine.validate(prompt_ids, params, kv_transfer_params, cache_salt)
        stream: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._queues[request_id] = stream
        self._send("add", (request_id, list(prompt_ids), params, cache_salt, kv_transfer_params))
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._send("abort", request_id)

    def _send(self, kind: str, payload: Any) -> None:
        self._inbox.put((kind, payload))
        self._wake.set()

    # -- the engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if self.engine.has_unfinished():
                    steps = self.engine.metrics.num_steps
                    outputs = self._step()
                    for out in outputs:
                        self._post(out.request_id, out)
                    if not outputs and self.engine.metrics.num_steps == steps:
                        # Nothing could run (KV loads in flight, pool full of held blocks):
                        # poll again shortly instead of spinning a core.
                        self._wake.wait(0.001)
                        self._wake.clear()
                else:
                    polls = (
                        self.engine.connector is not None or self.engine.manager.tier is not None
                    )
                    if polls:
                        # Held prefill blocks are released (read done, lease expired) and
                        # finished tier stores applied even when no request is running here.
                        self.engine.scheduler.settle_transfers()
                    self._wake.wait(0.005 if polls else self.idle_wait)
                    self._wake.clear()
        except BaseException as exc:  # the engine is unusable: fail everyone, loudly
            log.exception("engine thread died")
            self.dead = exc
            self._fail_all(EngineDeadError(f"engine failed: {exc!r}"))

    def _step(self) -> list[RequestOutput]:
        """One engine step. If the step raises, the requests in flight fail with the error
        (their blocks are freed) and the engine keeps serving; repeated failures in a row
        mean the engine itself is broken, and the thread stops (every caller is told)."""
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._failures += 1
            log.exception("engine step failed (%d in a row)", self._failures)
            if self._failures >= MAX_STEP_FAILURES:
                raise
            return self.engine.fail_all(f"engine step failed: {exc!r}")
        self._failures = 0
        return outputs

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                request_id, prompt_ids, params, salt, transfer = payload
                try:
                    self.engine.add_request(
                        request_id, prompt_ids, params, cache_salt=salt, kv_transfer_params=transfer
                    )
                except InvalidRequest as exc:
                    self._post(request_id, exc)
            elif kind == "abort":
                self.engine.abort(payload)

    def _post(self, request_id: str, item: RequestOutput | BaseException) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._deliver, request_id, item)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._queues.get(request_id)
        if stream is not None:
            stream.put_nowait(item)

    def _fail_all(self, exc: BaseException) -> None:
        assert self._loop is not None
        for request_id in list(self._queues):
            self._post(request_id, exc)
