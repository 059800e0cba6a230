"""An incremental decoder for server-sent events (the OpenAI streaming wire format).

Per the SSE spec: lines end with LF or CRLF, `data:` lines accumulate (joined by LF), a
blank line dispatches the event, lines starting with `:` are comments (keep-alive pings)
and other fields (`event`, `id`, `retry`) are ignored. Bytes may split anywhere, even
inside a UTF-8 character.
"""

from __future__ import annotations

import codecs


class SSEDecoder:
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
