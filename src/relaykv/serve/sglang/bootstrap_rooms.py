"""The prefill side of SGLang's bootstrap handshake: transfer parameters published per room.

A prefill engine serving a bootstrap request (`relaykv.serve.sglang.bootstrap`) runs it as a
P/D prefill (one token, `do_remote_decode`), and `RoomPublisher`, an ASGI middleware, reads
the `kv_transfer_params` of its JSON answer as it goes out and publishes them under the
request's `bootstrap_room` in `BootstrapRooms`. The decode engine that got the same request
fetches them with `GET /v1/relaykv/bootstrap/{room}` (under /v1, so the API key and draining
gate it like generation): the answer waits until the prefill is done, then hands the
parameters over exactly once. A prefill that failed publishes its error instead, so the
decode engine fails fast rather than computing the prompt itself.

Rooms are bounded: one is dropped once taken, or `ttl_s` after it was created (P's KV lease
frees the blocks of a room nobody took), and at most `max_rooms` wait at once (503 beyond).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relaykv.common.messages.api_errors import APIError

ROOM_KEY = "relaykv.bootstrap_room"  # set in the ASGI scope by the bootstrap dependency
ROOM_PATH = "/v1/relaykv/bootstrap/{room}"


@dataclass(slots=True)
class Room:
    created: float
    result: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class BootstrapRooms:
    """room -> the prefill's transfer parameters (or its error), taken once."""

    def __init__(self, ttl_s: float, max_rooms: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_rooms = max_rooms
        self.rooms: dict[int, Room] = {}

    def _room(self, room: int) -> Room:
        now = time.monotonic()
        for key in [k for k, r in self.rooms.items() if now - r.created > self.ttl_s]:
            self.rooms.pop(key).result.cancel()
        entry = self.rooms.get(room)
        if entry is None:
            if len(self.rooms) >= self.max_rooms:
                raise APIError(503, "too many bootstrap rooms waiting", code="service_unavailable")
            entry = self.rooms[room] = Room(now)
        return entry

    def open(self, room: int) -> None:
        self._room(room)

    def publish(self, room: int, answer: dict[str, Any]) -> None:
        entry = self.rooms.get(room)
        if entry is not None and not entry.result.done():
            entry.result.set_result(answer)

    async def take(self, room: int, timeout_s: float) -> dict[str, Any]:
        entry = self._room(room)
        try:
            return await asyncio.wait_for(asyncio.shield(entry.result), timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            raise APIError(
                504, f"no prefill result for bootstrap room {room}", "bootstrap_room"
            ) from None
        finally:
            if entry.result.done():
                self.rooms.pop(room, None)


def prefill_answer(status: int, body: bytes) -> dict[str, Any]:
    """What the decode engine gets: the transfer parameters, or the prefill's error."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    if status == 200 and isinstance(data, dict):
        params = data.get("kv_transfer_params")
        if isinstance(params, dict):
            return {"kv_transfer_params": params}
        return {"error": "the prefill engine answered without kv_transfer_params", "status": 502}
    message = f"the prefill engine answered {status}"
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        message += f": {data['error'].get('message')}"
    return {"error": message, "status": status if 400 <= status < 500 else 502}


class RoomPublisher:
    """ASGI middleware: publishes a bootstrap prefill's answer under its room as it is sent."""

    def __init__(self, app: ASGIApp, rooms: BootstrapRooms) -> None:
        self.app = app
        self.rooms = rooms

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        status = 500
        chunks: list[bytes] = []

        async def watch(message: Message) -> None:
            nonlocal status
            room = scope.get(ROOM_KEY)
            if room is not None:
                if message["type"] == "http.response.start":
                    status = message["status"]
                elif message["type"] == "http.response.body":
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        self.rooms.publish(room, prefill_answer(status, b"".join(chunks)))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            room = scope.get(ROOM_KEY)
            if room is not None:  # the handler died before answering
                self.rooms.publish(room, {"error": "the prefill request failed", "status": 502})


router = APIRouter()


@router.get(ROOM_PATH)
async def take_room(room: int, request: Request) -> Response:
    state = request.app.state
    rooms: BootstrapRooms | None = getattr(state, "relaykv_bootstrap_rooms", None)
    if rooms is None:
        raise APIError(
            404,
            "this engine serves no bootstrap rooms (not a prefill engine "
            "started with --sglang-bootstrap)",
            "bootstrap_room",
        )
    answer = await rooms.take(room, state.relaykv_bootstrap.timeout_s)
    if "error" in answer:
        raise APIError(int(answer["status"]), str(answer["error"]), "bootstrap_room")
    return JSONResponse(answer)
