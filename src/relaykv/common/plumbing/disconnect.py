"""A client that disconnects cancels the work done for it (docs/serving.md, "Client
disconnects").

Once a handler has read a request's body, the next ASGI `receive()` only returns when the
client goes away (`http.disconnect`). `unless_disconnected` runs a handler's work against
that: if the client leaves first, the work is cancelled, which aborts what it awaits (the
engine's request and its blocks for the engine's server; the connection to the engine, and
so the engine's request, for the router). Streams need no watcher: the server cancels the
body iterator on `http.disconnect`, which closes whatever it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready; the work was cancelled."""


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`await work`, or cancel it and raise ClientGone once the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    if task in done:
        return task.result()
    raise ClientGone()
