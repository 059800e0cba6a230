"""The router's engines by role: health and the requests in flight through this router.

Each engine is a `Backend` with a count of requests in flight through this router (which
engine takes a request is `routing.py`'s choice). A backend that fails a request or a health
check leaves the rotation until a health check succeeds again. `describe()` is the current
state: `last_error` is the reason an engine is out of rotation and is cleared when it comes
back (the history stays in `failures` and `last_failure`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Backend:
    url: str
    role: str  # prefill | decode
    in_flight: int = 0
    # Of those, the requests that decode there past their first token (asked for more than
    # one), from the decode call to their last token: the streams a local prefill would stall.
    streams: int = 0
    healthy: bool = True
    requests: int = 0
    failures: int = 0
    last_error: str = ""  # why it is out of rotation now ("" while healthy)
    last_failure: str = ""  # the most recent failure, kept after recovery
    last_check: float = 0.0
    engine_id: str | None = None  # its KV transfer identity, once known (destinations.py)

    def describe(self) -> dict[str, object]:
        age = round(time.monotonic() - self.last_check, 3) if self.last_check else None
        return {
            "url": self.url,
            "role": self.role,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "streams": self.streams,
            "requests": self.requests,
            "failures": self.failures,
            "last_error": self.last_error if not self.healthy else "",
            "last_failure": self.last_failure,
            "seconds_since_check": age,
            "engine_id": self.engine_id,
        }


class BackendPool:
    def __init__(self, role: str, urls: list[str]) -> None:
        if not urls:
            raise ValueError(f"at least one {role} engine URL is needed")
        self.role = role
        self.backends = [Backend(url.rstrip("/"), role) for url in urls]

    def first_healthy(self) -> Backend | None:
        """An engine in rotation, for calls any of them answers alike (`/v1/models`,
        `/tokenize`)."""
        return next((b for b in self.backends if b.healthy), None)

    def failed(self, backend: Backend, error: str) -> None:
        backend.healthy = False
        backend.engine_id = None  # it may come back as another process
        backend.failures += 1
        backend.last_error = backend.last_failure = error
        log.warning("%s engine %s taken out of rotation: %s", self.role, backend.url, error)

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.backends]

    @property
    def num_healthy(self) -> int:
        return sum(b.healthy for b in self.backends)

    async def check(self, client: httpx.AsyncClient, timeout: float = 2.0) -> None:
        """Probe every backend's /health; a recovered one rejoins the rotation."""

        async def one(backend: Backend) -> None:
            try:
                resp = await client.get(f"{backend.url}/health", timeout=timeout)
                ok = resp.status_code == 200
                error = "" if ok else f"/health answered {resp.status_code}"
            except httpx.HTTPError as exc:
                ok, error = False, f"/health: {exc.__class__.__name__}"
            backend.last_check = time.monotonic()
            if ok and not backend.healthy:
                log.info("%s engine %s back in rotation", self.role, backend.url)
            backend.healthy = ok
            backend.last_error = error
            if not ok:
                backend.last_failure = error
                backend.engine_id = None

        await asyncio.gather(*(one(b) for b in self.backends))
