"""Running the router under uvicorn with an ordered drain on SIGTERM (and SIGINT).

uvicorn's own handling closes the listening socket at once and re-raises the signal after
its shutdown, so the process dies by signal. Here the first SIGTERM or SIGINT starts a
drain: new requests get 503 (`Router.draining`), requests already in flight (streams
included) run to completion for up to `drain_timeout` seconds, then uvicorn shuts down and
the process exits 0. A second SIGINT forces the exit. `relaykv up` stops the router this way
before the engines (docs/pd.md, "Stopping").
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from fastapi import FastAPI

from relaykv.common.plumbing.graceful import GracefulServer, header_timeout_protocol
from relaykv.router.relay import Router

log = logging.getLogger("relaykv.router")


class DrainingRouterServer(GracefulServer):
    def __init__(self, config: uvicorn.Config, router: Router, drain_timeout: float) -> None:
        super().__init__(config)
        self.router = router
        self.drain_timeout = drain_timeout

    async def drain(self, signal_name: str) -> None:
        router = self.router
        router.draining = True
        print(
            f"relaykv router: {signal_name}: draining {router.in_flight} in-flight requests "
            f"(up to {self.drain_timeout:g} s), new requests get 503",
            flush=True,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        while router.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if router.in_flight:
            log.warning("drain timeout: %d requests still in flight", router.in_flight)


def serve_router(
    app: FastAPI,
    router: Router,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    drain_timeout: float = 60.0,
    limit_concurrency: int | None = None,
    header_timeout_s: float = 10.0,
) -> int:
    """Serve until a signal has drained the router; returns the exit status."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(max(1, header_timeout_s)),
        limit_concurrency=limit_concurrency,
        h11_max_incomplete_event_size=64 * 1024,
        http=header_timeout_protocol(header_timeout_s),
    )
    server = DrainingRouterServer(config, router, drain_timeout)
    server.run()
    return 0 if server.started else 1
