"""What every route reads: the served engine, its async front, the API key, draining."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from relaykv.common.messages.api_errors import APIError
from relaykv.engine import AsyncEngine
from relaykv.serve.assembly.engine_factory import ServedEngine


@dataclass(slots=True)
class ServerState:
    served: ServedEngine
    engine: AsyncEngine
    api_key: str | None = None
    drain_timeout: float = 30.0
    draining: bool = False
    stopped: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        return self.served.served_model_name

    async def stop_engine(self) -> None:
        """Drain: refuse new requests, let in-flight ones finish within `drain_timeout`,
        abort the rest, stop the engine thread. Idempotent (SIGTERM, then the lifespan)."""
        self.draining = True
        if not self.stopped:
            self.stopped = True
            await self.engine.shutdown(self.drain_timeout)

    def check_accepting(self) -> None:
        """503 while draining (SIGTERM) or after the engine stopped; 500 if it died."""
        if self.engine.dead is not None:
            raise APIError(500, f"the engine failed: {self.engine.dead!r}", code="engine_dead")
        if self.draining or not self.engine.accepting:
            raise APIError(503, "the server is shutting down", code="service_unavailable")


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.relaykv
    return state
