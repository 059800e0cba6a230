"""A uvicorn server whose first SIGTERM (or SIGINT) drains instead of dying by the signal.

uvicorn's own handling closes the listening socket at once and, after its graceful
shutdown, re-raises the signal, so the process dies with status -15. A `GracefulServer`
instead runs `drain(signal name)` on its event loop (the subclass says what draining means:
the engine server finishes its requests, the router its relays), then shuts uvicorn down and
returns normally, so the process exits 0. A second SIGINT forces the exit. On the shared
floor: the serve and router layers both use it, with `header_timeout_protocol`.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from abc import abstractmethod
from types import FrameType

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

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
        try:
            await self.drain(name)
        finally:
            self.should_exit = True

    @abstractmethod
    async def drain(self, signal_name: str) -> None:
        """Stop taking work and let what is in flight finish (bounded)."""


def header_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for a new connection's first request headers
    (uvicorn has none: a connection that never sends a request is held forever). Later
    requests on a kept-alive connection are bounded by uvicorn's keep-alive timeout."""

    class HeaderTimeoutProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._header_timer = asyncio.get_running_loop().call_later(
                timeout_s, self._header_deadline
            )

        def _header_deadline(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()  # no request line and headers in time

        def connection_lost(self, exc: Exception | None) -> None:
            self._header_timer.cancel()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol
