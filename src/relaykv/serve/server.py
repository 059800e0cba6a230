"""Running the app under uvicorn with a graceful SIGTERM (and SIGINT).

uvicorn's own handling closes the listening socket at once and, after its graceful
shutdown, re-raises the signal, so the process dies with status -15. Here the first SIGTERM
or SIGINT starts a drain instead: the socket stays open and new requests get 503, in-flight
requests finish (or are aborted after `--drain-timeout`), the engine thread stops, and then
uvicorn shuts down and `serve_app` returns 0. A second SIGINT forces the exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from relaykv.serve.app import app_state
from relaykv.serve.state import ServerState

log = logging.getLogger("relaykv.serve")


class DrainingServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        state: ServerState,
        on_ready: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.state = state
        self.on_ready = on_ready
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self.url = f"http://{host}:{port}"
            if self.on_ready is not None:
                self.on_ready(self.url)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Deliberately not uvicorn's: no re-raise of the signal after shutdown (exit 0).
        if self._drain is not None or self._loop is None:
            if sig == signal.SIGINT or self._loop is None:
                self.should_exit = True
                self.force_exit = self._drain is not None
            return
        self._loop.call_soon_threadsafe(self._start_drain, signal.Signals(sig).name)

    def _start_drain(self, name: str) -> None:
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._drain_then_exit(name))

    async def _drain_then_exit(self, name: str) -> None:
        state = self.state
        log.info(
            "%s: draining %d in-flight requests (up to %.1f s)",
            name,
            state.engine.num_active,
            state.drain_timeout,
        )
        print(
            f"relaykv serve: {name}: draining {state.engine.num_active} in-flight requests "
            f"(up to {state.drain_timeout:g} s), new requests get 503",
            flush=True,
        )
        try:
            await state.stop_engine()
        finally:
            self.should_exit = True


def serve_app(
    app: FastAPI,
    host: str,
    port: int,
    *,
    log_level: str = "info",
    access_log: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT has drained the engine; returns the exit status."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = DrainingServer(config, app_state(app), on_ready)
    server.run()
    return 0 if server.started else 1
