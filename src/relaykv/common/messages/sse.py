"""Server-sent events, the OpenAI streaming wire format: the frames a server writes and the
incremental decoder a client reads them with.

Writing (the engine's streams and the router's relay): one JSON object per `data:` line,
compact and UTF-8 (`sse_event`), an error in-band as an OpenAI error body (`sse_error`),
and `data: [DONE]` last (`DONE`).

Reading (`SSEDecoder`, the benchmark client), per the SSE spec: lines end with LF or CRLF,
`data:` lines accumulate (joined by LF), a blank line dispatches the event, lines starting
with `:` are comments (keep-alive pings) and other fields (`event`, `id`, `retry`) are
ignored. Bytes may split anywhere, even inside a UTF-8 character.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from typing import Any

from relaykv.common.messages.api_errors import APIError, error_body

DONE = b"data: [DONE]\n\n"


def sse_event(event: Mapping[str, Any]) -> bytes:
    """One event: its JSON (compact, UTF-8) on a `data:` line, then the blank line."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
    return b"data: " + data + b"\n\n"


def sse_error(exc: BaseException | str, status: int = 500) -> bytes:
    """An in-band error event (what OpenAI streams send for a failure mid-stream): an
    `APIError`'s own body, else a `status` error body with the message."""
    if isinstance(exc, APIError):
        return sse_event(exc.body())
    message = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return sse_event(error_body(status, message))


class SSEDecoder:
    """Bytes in, the data of each completed event out."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial_line = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Add bytes; return the data of every event completed by them."""
        text = self._partial_line + self._utf8.decode(chunk)
        lines = text.split("\n")
        self._partial_line = lines.pop()
        events: list[str] = []
        for line in lines:
            self._take_line(line.removesuffix("\r"), events)
        return events

    def close(self) -> list[str]:
        """End of stream: dispatch a last event the server did not end with a blank line."""
        events: list[str] = []
        tail = self._partial_line + self._utf8.decode(b"", final=True)
        self._partial_line = ""
        if tail:
            self._take_line(tail.removesuffix("\r"), events)
        self._take_line("", events)
        return events

    def _take_line(self, line: str, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value.removeprefix(" "))
