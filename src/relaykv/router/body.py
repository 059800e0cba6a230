"""The client's request body as the router forwards it: its own bytes, never re-encoded.

Re-encoding a parsed body loses or breaks what the engine must judge for itself: a lone
surrogate (`"\\ud800"`) cannot be encoded as UTF-8, `Infinity` or `1e309` is not valid JSON
output, big integers and float spellings change. So the router parses the body only to read
it (`stream`, whether `max_completion_tokens` is there) and forwards the client's bytes with
the few fields a hop must set appended at the end of the object. JSON parsers that keep the
last value of a repeated key (Python's `json`, which the engines use) read the appended
values; every other byte is the client's, so the engine answers exactly the 400 it would
answer the client directly (docs/pd.md "The router").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from relaykv.common.messages.api_errors import APIError


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
