"""Client disconnects abort the work the router does for them, streaming or not.

Once the router has read a request's body, the next ASGI `receive()` only returns when the
client goes away (`http.disconnect`). `unless_disconnected` runs the router's work for a
request (the prefill call, a non-streaming decode call) against that: if the client leaves
first, the work is cancelled, which closes the connection to the engine, and the engine
aborts the request and frees its blocks (docs/serving.md, "Client disconnects"). Streams
need no watcher: the server cancels the relaying generator, which closes the engine's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

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
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    if task.cancelled():
        raise ClientGone()
    return task.result()
