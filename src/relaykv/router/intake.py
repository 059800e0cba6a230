"""What the router accepts from a client, checked before any engine sees the request.

* A body larger than `max_body_bytes` (default 8 MiB) is refused with 413, by its
  Content-Length before reading or while reading, so a huge prompt never reaches (and
  blocks) an engine's event loop.
* A body that does not arrive within `body_timeout_s` is refused with 408; headers have
  their own timeout in the HTTP server (server.py), so half-open connections do not pile up.
* A body that is not a JSON object, is nested too deeply, or holds a lone surrogate (not
  valid Unicode) is refused with 400 and an OpenAI-style error body, never a 500.

docs/serving.md ("Limits and timeouts") lists the defaults and flags.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
from fastapi import Request

from relaykv.api_errors import APIError

DEFAULT_MAX_BODY_BYTES = 8 << 20
MAX_NESTING = 64


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


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value, stopping once past `limit`."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = msgspec.json.decode(raw)
    except RecursionError:
        raise APIError(400, f"the request body is nested more than {MAX_NESTING} levels deep") \
            from None
    except (msgspec.DecodeError, UnicodeDecodeError):
        raise APIError(
            400, "the request body is not valid JSON (or holds text that is not valid Unicode, "
            "such as a lone surrogate)"
        ) from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    if _depth(body, MAX_NESTING) > MAX_NESTING:
        raise APIError(400, f"the request body is nested more than {MAX_NESTING} levels deep")
    return body
