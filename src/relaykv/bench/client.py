"""The async streaming request: one OpenAI-style request in, one `RequestOutcome` out.

Timing (docs/benchmarking.md "Metrics", as vLLM measures it):
the clock starts just before the POST; a *token
chunk* is a streamed event carrying at least one choice (the trailing usage-only chunk,
`choices: []`, SSE comments and a chat stream's opening role-only chunk, whose delta has a
`role` and no text, are not); TTFT = first token chunk, ITL = gaps between token chunks,
E2EL = last token chunk. Usage may arrive in any chunk; the last one wins.

Success requires HTTP 200, at least one token chunk and the closing `data: [DONE]`; a
stream that ends without it was cut (a dropped connection), so it counts as failed. Any
error - HTTP status, undecodable chunk, an `error` object in the stream, dropped connection,
timeout - is caught and recorded in `RequestOutcome.error`; this function never raises
for a failed request.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from relaykv.bench.outcome import RequestOutcome
from relaykv.common.messages.sse import SSEDecoder
from relaykv.common.workloads import SampleRequest

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class ApiTarget:
    """Where and how requests are sent; `chat` selects the chat-completions payload."""

    api_url: str
    model: str
    chat: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    ignore_eos: bool = False
    timeout_s: float = 6 * 60 * 60


def build_payload(target: ApiTarget, request: SampleRequest) -> dict[str, Any]:
    """The JSON body: token ids as `prompt` unless the request carries text."""
    body: dict[str, Any] = {"model": target.model}
    if target.chat:
        if request.prompt is None:
            raise ValueError("chat requests need text prompts (a tokenizer)")
        body["messages"] = [{"role": "user", "content": request.prompt}]
        body["max_completion_tokens"] = request.output_len
    else:
        body["prompt"] = request.prompt if request.prompt is not None else request.prompt_ids
        body["max_tokens"] = request.output_len
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if target.ignore_eos:
        body["ignore_eos"] = True
    body.update(target.sampling)
    return body


class _StreamState:
    """Folds parsed events into an outcome; raises `_StreamError` on a bad event."""

    def __init__(self, outcome: RequestOutcome, chat: bool) -> None:
        self.out = outcome
        self.chat = chat
        self.last_token_at: float | None = None
        self.token_chunks = 0
        self.done = False
        self.text: list[str] = []

    def take(self, data: str, now: float) -> None:
        if self.done:
            return
        if data.strip() == DONE:
            self.done = True
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            raise _StreamError(f"bad stream chunk (not JSON): {data[:200]!r}") from None
        if not isinstance(event, dict):
            raise _StreamError(f"bad stream chunk (not an object): {data[:200]!r}")
        if "error" in event or event.get("object") == "error":
            err = event.get("error", event)
            message = err.get("message", err) if isinstance(err, dict) else err
            raise _StreamError(f"server error in stream: {message}")
        if event.get("choices") and not self._opening(event):
            if self.last_token_at is None:
                self.out.ttft = now - self.out.start_time
            else:
                self.out.itl.append(now - self.last_token_at)
            self.last_token_at = now
            self.token_chunks += 1
            choice = event["choices"][0] or {}
            piece = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
            self.text.append(piece or "")
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._take_usage(usage)

    def _opening(self, event: dict[str, Any]) -> bool:
        """A chat stream's opening chunk (vLLM's role-only delta before the first token)."""
        if not self.chat or self.last_token_at is not None:
            return False
        choice = event["choices"][0] or {}
        delta = choice.get("delta") or {}
        return "role" in delta and not delta.get("content") and not choice.get("token_ids")

    def _take_usage(self, usage: dict[str, Any]) -> None:
        if isinstance(usage.get("completion_tokens"), int):
            self.out.output_tokens = usage["completion_tokens"]
            self.out.usage_missing = False
        if isinstance(usage.get("prompt_tokens"), int):
            self.out.prompt_len = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            self.out.cached_tokens = details["cached_tokens"]

    def finish(self) -> None:
        if not self.done:
            raise _StreamError("stream ended before data: [DONE] (connection dropped?)")
        if self.last_token_at is None:
            raise _StreamError("no token chunk before data: [DONE]")
        self.out.latency = self.last_token_at - self.out.start_time
        self.out.generated_text = "".join(self.text)
        if self.out.usage_missing:
            self.out.output_tokens = self.token_chunks
        self.out.success = True


class _StreamError(Exception):
    pass


async def send_request(
    session: aiohttp.ClientSession, target: ApiTarget, request: SampleRequest
) -> RequestOutcome:
    """Send one streaming request and measure it; failures are recorded, not raised."""
    out = RequestOutcome(prompt_len=request.prompt_len, usage_missing=True)
    state = _StreamState(out, target.chat)
    try:
        payload = build_payload(target, request)
        out.start_time = time.perf_counter()
        timeout = aiohttp.ClientTimeout(total=target.timeout_s)
        async with session.post(
            target.api_url, json=payload, headers=target.headers, timeout=timeout
        ) as response:
            if response.status != 200:
                body = (await response.text(errors="replace"))[:500]
                raise _StreamError(f"HTTP {response.status} {response.reason}: {body}")
            decoder = SSEDecoder()
            async for chunk in response.content.iter_any():
                now = time.perf_counter()
                for data in decoder.feed(chunk):
                    state.take(data, now)
                if state.done:
                    break
            if not state.done:
                for data in decoder.close():
                    state.take(data, time.perf_counter())
        state.finish()
    except _StreamError as exc:
        out.error = str(exc)
    except TimeoutError:
        out.error = f"timeout after {target.timeout_s:g} s"
    except aiohttp.ClientError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a benchmark records every failure and keeps going
        out.error = f"{type(exc).__name__}: {exc}"
    if not out.success:
        out.output_tokens = 0
    return out
