"""What the router accepts from a client, checked before any engine sees the request.

* A body larger than `max_body_bytes` (default 8 MiB) is refused with 413, by its
  Content-Length before reading or while reading, so a huge prompt never reaches (and
  blocks) an engine's event loop.
* A body that does not arrive within `body_timeout_s` is refused with 408; headers have
  their own timeout in the HTTP server (server.py), so half-open connections do not pile up.
* What the body says is the engines' to judge: the router forwards the client's own bytes
  (`relaykv.router.body`), 400 only when it is not one JSON object at all.

docs/serving.md ("Limits and timeouts") lists the defaults and flags.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import Request

from relaykv.common.messages.api_errors import APIError

DEFAULT_MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class IntakeLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError("the body limit must be >= 1 byte")
        if self.body_timeout_s <= 0 or self.header_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body exceeds the router's limit of {limit} bytes",
                    code="request_too_large")


async def read_body(request: Request, limits: IntakeLimits) -> bytes:
    """The whole body, within the size limit (413) and the body timeout (408)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_large(limits.max_body_bytes)

    async def collect() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise _too_large(limits.max_body_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(collect(), limits.body_timeout_s)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {limits.body_timeout_s:g}s",
                       code="request_timeout") from None
