"""The router's calls to one engine, and how it judges the answer (docs/pd.md "Failures").

An engine that cannot be reached or answers 5xx leaves the rotation (`BackendPool.failed`) and
the call returns None, so the request path tries another one; 503 means draining (out of
rotation, not counted as a failure). Errors an engine returns for the request itself (4xx) are
answers, relayed to the client unchanged. A decode engine's stream is relayed byte for byte;
one that breaks or ends early gets an in-band error event, and every stream ends with
`data: [DONE]`. Each call counts on the engine (`Backend.in_flight`) while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from relaykv.common.messages.api_errors import error_body
from relaykv.common.messages.sse import DONE, sse_error
from relaykv.router.backends import Backend, BackendPool
from relaykv.router.metrics import RouterStats


class EngineCalls:
    """HTTP calls to the engines through one client (set when the app starts)."""

    def __init__(
        self, timeout: httpx.Timeout, stats: RouterStats, on_stream_end: Callable[[], None]
    ) -> None:
        self.client: httpx.AsyncClient | None = None
        self.timeout = timeout
        self.stats = stats
        self._on_stream_end = on_stream_end  # the router counts a stream out when it ends

    async def post(
        self,
        pool: BackendPool,
        backend: Backend,
        path: str,
        body: bytes,
        headers: dict[str, str],
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response | None:
        """The engine's answer, or None when it failed (out of rotation)."""
        assert self.client is not None
        backend.in_flight += 1
        backend.requests += 1
        try:
            resp = await self.client.post(
                f"{backend.url}{path}", content=body, headers=headers,
                timeout=timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            pool.failed(backend, f"{exc.__class__.__name__}: {exc}")
            return None
        finally:
            backend.in_flight -= 1
        if resp.status_code >= 500 and resp.status_code != 503:
            pool.failed(backend, f"answered {resp.status_code}")
            return None
        if resp.status_code == 503:  # draining: not broken, just not taking work
            backend.healthy = False
            backend.last_error = "draining (503)"
            return None
        return resp

    async def decode(
        self,
        pool: BackendPool,
        backend: Backend,
        path: str,
        body: bytes,
        headers: dict[str, str],
        stream: bool,
        decodes: bool = False,
    ) -> Response | None:
        """A decode engine's answer (streamed through), or None when it failed. `decodes`:
        the request asks for more than one token, so it counts among the engine's
        `streams` until its answer ends."""
        backend.streams += decodes
        if not stream:
            try:
                resp = await self.post(pool, backend, path, body, headers)
            finally:
                backend.streams -= decodes
            return None if resp is None else relayed(resp)
        try:
            opened = await self._open_stream(pool, backend, path, body, headers)
            if opened is not None and opened.status_code != 200:
                await opened.aread()
                await opened.aclose()
        except BaseException:
            backend.streams -= decodes
            raise
        if opened is None or opened.status_code != 200:
            backend.streams -= decodes
            return None if opened is None else relayed(opened)
        counts = _StreamCounts(backend, decodes, self._on_stream_end)
        relay = self._relay_stream(pool, backend, opened, counts)
        # A relay dropped unread (the client left before the first byte: its `finally`
        # never runs) gives its counts back when it is collected, and closes the engine's
        # stream: a leaked stream would keep local requests off that engine for good.
        weakref.finalize(relay, counts.release, opened)
        return StreamingResponse(relay, media_type="text/event-stream")

    async def _open_stream(
        self, pool: BackendPool, backend: Backend, path: str, body: bytes, headers: dict
    ) -> httpx.Response | None:
        assert self.client is not None
        req = self.client.build_request(
            "POST", f"{backend.url}{path}", content=body, headers=headers
        )
        backend.in_flight += 1
        backend.requests += 1
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as exc:
            backend.in_flight -= 1
            pool.failed(backend, f"{exc.__class__.__name__}: {exc}")
            return None
        except BaseException:  # cancelled (its client's task stopped), or unexpected
            backend.in_flight -= 1
            raise
        if resp.status_code >= 500:
            backend.in_flight -= 1
            await resp.aclose()
            if resp.status_code == 503:
                backend.healthy = False
            else:
                pool.failed(backend, f"answered {resp.status_code}")
            return None
        if resp.status_code != 200:
            backend.in_flight -= 1
        return resp

    async def _relay_stream(
        self, pool: BackendPool, backend: Backend, resp: httpx.Response, counts: _StreamCounts
    ) -> AsyncIterator[bytes]:
        """Pass the engine's SSE bytes through; a client that goes away closes the engine's
        stream too. Every stream ends with `data: [DONE]`, a broken one after an in-band
        error event."""
        tail = b""
        try:
            try:
                async for chunk in resp.aiter_raw():
                    tail = (tail + chunk)[-64:]
                    yield chunk
            except httpx.HTTPError as exc:
                pool.failed(backend, f"stream broke: {exc.__class__.__name__}")
                self.stats.stream_errors += 1
                yield sse_error(f"the decode engine's stream broke: {exc}", 502)
                tail = b""
            if DONE.rstrip() not in tail:
                if tail:  # the engine closed cleanly without finishing the stream
                    self.stats.stream_errors += 1
                    yield sse_error("the decode engine ended the stream early", 502)
                yield DONE
        finally:
            counts.release()
            await resp.aclose()


class _StreamCounts:
    """What an open stream holds: the engine's `in_flight` (and `streams` when it decodes)
    and the router's request count (`on_end`); released once, when the relay ends or is
    collected unread."""

    def __init__(self, backend: Backend, decodes: bool, on_end: Callable[[], None]) -> None:
        self.backend, self.decodes, self.on_end = backend, decodes, on_end
        self.held = True

    def release(self, unread: httpx.Response | None = None) -> None:
        if not self.held:
            return
        self.held = False
        self.backend.in_flight -= 1
        self.backend.streams -= self.decodes
        self.on_end()
        if unread is not None:  # collected unread: close the engine's stream when we can
            with contextlib.suppress(RuntimeError):  # no running loop: the client closes it
                task = asyncio.get_running_loop().create_task(unread.aclose())
                # the loop keeps only a weak reference to a task: hold it until it is done
                _CLOSING.add(task)
                task.add_done_callback(_CLOSING.discard)


# Engine streams being closed after their relay was collected unread (see release).
_CLOSING: set[asyncio.Task[None]] = set()


def relayed(resp: httpx.Response) -> Response:
    """An engine's answer, passed through (content type and status kept)."""
    return Response(
        content=resp.content,
        status_code=resp.status_code,
        media_type=resp.headers.get("content-type", "application/json"),
    )


def unavailable(role: str) -> Response:
    message = f"no {role} engine is available (all failed or are out of rotation)"
    return JSONResponse(error_body(503, message, code="no_backend"), status_code=503)
