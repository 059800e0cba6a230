"""What the router accepts from a client, checked before any engine sees the request.

* A body larger than `max_body_bytes` (default 8 MiB) is refused with 413, by its
  Content-Length before reading or while reading, so a huge prompt never reaches (and
  blocks) an engine's event loop.
* A body that does not arrive within `body_timeout_s` is refused with 408; headers have
  their own timeout in the HTTP server (server.py), so half-open connections do not pile up.
* What the body says is the engines' to judge: the router forwards the client's own bytes
  (`ClientBody`, below), 400 only when it is not one JSON object at all.

The body as the router forwards it: its own bytes, never re-encoded. Re-encoding a parsed
body loses or breaks what the engine must judge for itself: a lone surrogate (`"\\ud800"`)
cannot be encoded as UTF-8, `Infinity` or `1e309` is not valid JSON output, big integers and
float spellings change. So the router parses the body only to read it (`stream`, the prompt)
and forwards the client's bytes with the few fields a hop must set appended at the end of the
object. JSON parsers that keep the last value of a repeated key (Python's `json`, which the
engines use) read the appended values; every other byte is the client's, so the engine
answers exactly the 400 it would answer the client directly (docs/pd.md "The router").

docs/serving.md ("Limits and timeouts") lists the defaults and flags.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True, slots=True)
class ClientBody:
    raw: bytes
    data: dict[str, Any]

    @classmethod
    def parse(cls, raw: bytes) -> ClientBody:
        """400 unless the body is one JSON object (the engine checks its fields)."""
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise APIError(400, f"malformed JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the request body must be a JSON object")
        return cls(raw, data)

    @property
    def stream(self) -> bool:
        return self.data.get("stream") is True

    @property
    def decodes(self) -> bool:
        """Whether the request may generate more than one token (its output cap, chat's
        `max_completion_tokens` else `max_tokens`, above 1 or not given): a stream on its
        decode engine after the first token. A bad value counts as decoding (the engine
        refuses it)."""
        for field in ("max_completion_tokens", "max_tokens"):
            value = self.data.get(field)
            if value is not None:
                return not (isinstance(value, int) and not isinstance(value, bool) and value <= 1)
        return True

    def with_fields(self, fields: dict[str, Any]) -> bytes:
        """The client's bytes with `fields` appended as the object's last members."""
        # ensure_ascii: the appended text is ASCII, whatever the values (never a 500 here).
        extra = json.dumps(fields, ensure_ascii=True, separators=(",", ":"))[1:-1].encode()
        body = self.raw.rstrip()
        if not self.raw.lstrip().startswith(b"{") or not body.endswith(b"}"):
            # Not plain UTF-8 text around the object (a BOM, UTF-16): re-encode as ASCII JSON,
            # which still carries every value (surrogates as escapes, non-finite numbers as
            # the `NaN` / `Infinity` literals the engine's parser reads and refuses).
            return json.dumps({**self.data, **fields}, ensure_ascii=True).encode()
        if not fields:
            return self.raw
        separator = b"," if self.data else b""
        return body[:-1] + separator + extra + b"}"
