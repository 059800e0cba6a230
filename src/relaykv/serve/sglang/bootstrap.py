"""SGLang's bootstrap P/D mode: served through a room handshake, or refused with a 400.

SGLang's gateways (`sglang-router`, `smg`, `--pd-disaggregation`) send the *same* body to
the prefill and the decode engine at once, adding `bootstrap_host`, `bootstrap_port` (the
prefill engine's address as the gateway knows it) and `bootstrap_room` (a random id shared
by the pair). Served as plain requests both engines would compute the whole request and no
KV would move: twice the work, silently. So:

* By default every engine refuses such a request with a 400 (`unsupported_pd_mode`) before
  anything runs, naming the mode and what to use instead.
* Started with `--sglang-bootstrap`, the pair shakes hands instead (docs/pd.md): the prefill
  engine runs the request as a P/D prefill (one token, `kv_transfer_params:
  {"do_remote_decode": true}`, answered as JSON) and publishes its transfer parameters
  under the room (`relaykv.serve.sglang.bootstrap_rooms`); the decode engine fetches them from
  `http://bootstrap_host:bootstrap_port/v1/relaykv/bootstrap/{room}`, waiting for the
  prefill, and decodes with them as if a relaykv or vLLM router had passed them. The
  gateway's bootstrap port must therefore be the prefill engine's HTTP port. A decode engine
  only ever contacts the prefill engines named by `--sglang-bootstrap-peers HOST:PORT,...`
  (the address comes from the request, so it is checked before any connection), with its
  own API key; the parameters it gets are validated like any `kv_transfer_params`.

`sglang_bootstrap` is a FastAPI dependency of the generation routes (see `relaykv.serve.api.app`):
it reads the body, parses it only when the field names occur in it, and hands the handler the
rewritten body (Starlette caches the body on the request, which the handler reads again).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request

from relaykv.common.messages.api_errors import APIError, bad_request
from relaykv.serve.sglang import bootstrap_rooms
from relaykv.serve.sglang.bootstrap_rooms import ROOM_KEY, BootstrapRooms, RoomPublisher

BOOTSTRAP_FIELDS = ("bootstrap_room", "bootstrap_host", "bootstrap_port")

MESSAGE = (
    "SGLang's bootstrap P/D mode ({fields} in the request, as sglang-router and smg send "
    "with --pd-disaggregation) is not enabled on this engine: relaykv engines move KV through "
    "kv_transfer_params, so both engines would compute the whole request. Start the prefill "
    "and decode engines with --sglang-bootstrap (and --sglang-bootstrap-peers on decode), or "
    "put vllm-router --vllm-pd-disaggregation or `relaykv router` in front of them instead "
    "(docs/pd.md)."
)


@dataclass(frozen=True, slots=True)
class BootstrapConfig:
    role: str  # prefill | decode
    peers: frozenset[tuple[str, int]] = frozenset()  # decode: prefill engines it may ask
    timeout_s: float = 60.0  # decode: how long to wait for the prefill's parameters


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SGLang gateways (docs/pd.md)")
    group.add_argument(
        "--sglang-bootstrap",
        action="store_true",
        help="serve sglang-router / smg P/D requests (bootstrap_room) through a room handshake "
        "instead of refusing them; the gateway's bootstrap port must be P's HTTP port",
    )
    group.add_argument(
        "--sglang-bootstrap-peers",
        default="",
        metavar="HOST:PORT[,HOST:PORT]",
        help="decode: the prefill engines (as the gateway names them) it may fetch from",
    )


def parse_peers(text: str) -> frozenset[tuple[str, int]]:
    peers = set()
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"argument --sglang-bootstrap-peers: expected HOST:PORT, got {item!r}")
        peers.add((host, int(port)))
    return frozenset(peers)


def config_from_args(
    args: argparse.Namespace, role: str, timeout_s: float
) -> BootstrapConfig | None:
    """The handshake's configuration, None when off; ValueError naming the flag."""
    peers = parse_peers(args.sglang_bootstrap_peers)
    if not args.sglang_bootstrap:
        if peers:
            raise ValueError("argument --sglang-bootstrap-peers: needs --sglang-bootstrap")
        return None
    if role not in ("prefill", "decode"):
        raise ValueError("argument --sglang-bootstrap: needs --role prefill or --role decode")
    if role == "decode" and not peers:
        raise ValueError(
            "argument --sglang-bootstrap-peers: a decode engine needs the prefill engines it "
            "may fetch transfer parameters from"
        )
    return BootstrapConfig(role, peers, timeout_s)


def install(app: FastAPI, config: BootstrapConfig | None) -> None:
    """Turn the handshake on for `app` (before it starts); None leaves the refusal."""
    app.state.relaykv_bootstrap = config
    if config is not None and config.role == "prefill":
        rooms = BootstrapRooms(ttl_s=config.timeout_s)
        app.state.relaykv_bootstrap_rooms = rooms
        app.add_middleware(RoomPublisher, rooms=rooms)
    app.include_router(bootstrap_rooms.router)


def bootstrap_fields(body: bytes) -> list[str]:
    """The SGLang bootstrap fields set (not null) at the top level of a JSON body."""
    if b"bootstrap_" not in body:
        return []
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return []  # the handler answers malformed JSON with its own 400
    if not isinstance(data, dict):
        return []
    return [name for name in BOOTSTRAP_FIELDS if data.get(name) is not None]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _fetch(
    host: str, port: int, room: int, api_key: str | None, timeout_s: float
) -> dict[str, Any]:
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    url = f"http://{netloc}{bootstrap_rooms.ROOM_PATH.format(room=room)}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s + 5) as client:
            resp = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise APIError(502, f"cannot reach the prefill engine {netloc}: {exc}") from None
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code != 200 or not isinstance(body, dict):
        detail = body.get("error", {}).get("message") if isinstance(body, dict) else None
        status = resp.status_code if 400 <= resp.status_code < 500 else 502
        raise APIError(status, f"prefill engine {netloc}: {detail or resp.status_code}")
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise APIError(502, f"prefill engine {netloc} returned no kv_transfer_params")
    return params


def _refusal(found: list[str]) -> APIError:
    return APIError(400, MESSAGE.format(fields="/".join(found)), found[0], "unsupported_pd_mode")


async def refuse_sglang_bootstrap(request: Request) -> None:
    """For routes that generate nothing (tokenize, render): the fields are always refused."""
    found = bootstrap_fields(await request.body())
    if found:
        raise _refusal(found)


async def sglang_bootstrap(request: Request) -> None:
    """The dependency: nothing for ordinary requests; refuse or shake hands otherwise."""
    body = await request.body()
    found = bootstrap_fields(body)
    if not found:
        return
    config: BootstrapConfig | None = getattr(request.app.state, "relaykv_bootstrap", None)
    if config is None:
        raise _refusal(found)
    data = json.loads(body)
    room, host, port = (data.pop(name, None) for name in BOOTSTRAP_FIELDS)
    if not _is_int(room) or room < 0:
        raise bad_request("bootstrap_room must be a non-negative integer", "bootstrap_room")
    if data.get("kv_transfer_params") is not None:
        raise bad_request(
            "kv_transfer_params and bootstrap_room exclude each other", "bootstrap_room"
        )
    if config.role == "prefill":
        data["stream"] = False  # the gateway discards P's answer; JSON carries the parameters
        data.pop("stream_options", None)
        data["kv_transfer_params"] = {"do_remote_decode": True}
        request.app.state.relaykv_bootstrap_rooms.open(room)
        request.scope[ROOM_KEY] = room
    else:
        if not isinstance(host, str) or not _is_int(port) or (host, port) not in config.peers:
            raise bad_request(
                f"bootstrap_host:bootstrap_port {host}:{port} is not one of this engine's "
                "--sglang-bootstrap-peers",
                "bootstrap_host",
            )
        api_key = request.app.state.relaykv.api_key
        data["kv_transfer_params"] = await _fetch(host, port, room, api_key, config.timeout_s)
    request._body = json.dumps(data).encode()  # what the handler reads (Starlette's cache)
