"""Running the app under uvicorn with a graceful SIGTERM (and SIGINT).

uvicorn's own handling closes the listening socket at once and, after its graceful
shutdown, re-raises the signal, so the process dies with status -15. Here the first SIGTERM
or SIGINT starts a drain instead: the socket stays open and new requests get 503, in-flight
requests finish (or are aborted after `--drain-timeout`), the engine thread stops, and then
uvicorn shuts down and `serve_app` returns 0. A second SIGINT forces the exit.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from relaykv.common.plumbing.graceful import GracefulServer, header_timeout_protocol
from relaykv.serve.api.app import app_state
from relaykv.serve.api.state import ServerState

log = logging.getLogger("relaykv.serve")
HEADER_TIMEOUT_S = 10.0


class DrainingServer(GracefulServer):
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

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self.url = f"http://{host}:{port}"
            if self.on_ready is not None:
                self.on_ready(self.url)

    async def drain(self, signal_name: str) -> None:
        state = self.state
        log.info(
            "%s: draining %d in-flight requests (up to %.1f s)",
            signal_name,
            state.engine.num_active,
            state.drain_timeout,
        )
        print(
            f"relaykv serve: {signal_name}: draining {state.engine.num_active} in-flight "
            f"requests (up to {state.drain_timeout:g} s), new requests get 503",
            flush=True,
        )
        await state.stop_engine()


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
        http=header_timeout_protocol(HEADER_TIMEOUT_S),  # no idle half-open connections
    )
    server = DrainingServer(config, app_state(app), on_ready)
    server.run()
    return 0 if server.started else 1
