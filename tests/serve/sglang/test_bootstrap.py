"""SGLang's bootstrap handshake pieces: the room registry, the prefill answer, the flags.

End to end (real gateways, a real P/D pair) is in test_production_routers.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from relaykv.common.messages.api_errors import APIError
from relaykv.serve.sglang.bootstrap import bootstrap_fields, config_from_args, parse_peers
from relaykv.serve.sglang.bootstrap_rooms import BootstrapRooms, prefill_answer

PARAMS = {"remote_engine_id": "p0", "remote_block_ids": [[1, 2]]}


async def test_a_room_waits_for_the_prefill_and_is_taken_once() -> None:
    rooms = BootstrapRooms(ttl_s=30)
    taker = asyncio.ensure_future(rooms.take(7, timeout_s=5))  # D asks before P is done
    await asyncio.sleep(0.01)
    rooms.open(7)  # P's request arrives
    rooms.publish(7, {"kv_transfer_params": PARAMS})
    assert await taker == {"kv_transfer_params": PARAMS}
    assert rooms.rooms == {}
    with pytest.raises(APIError) as err:  # a second take gets nothing
        await rooms.take(7, timeout_s=0.05)
    assert err.value.status == 504


async def test_rooms_expire_and_are_bounded() -> None:
    rooms = BootstrapRooms(ttl_s=0.05, max_rooms=2)
    rooms.open(1)
    rooms.open(2)
    with pytest.raises(APIError) as err:
        rooms.open(3)
    assert err.value.status == 503
    await asyncio.sleep(0.1)
    rooms.open(3)  # the expired ones were dropped
    assert list(rooms.rooms) == [3]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, {"kv_transfer_params": PARAMS}, {"kv_transfer_params": PARAMS}),
        (200, {"choices": []}, {"status": 502}),
        (400, {"error": {"message": "prompt too long"}}, {"status": 400}),
        (500, b"not json", {"status": 502}),
    ],
)
def test_prefill_answer(status: int, body: object, expected: dict) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = prefill_answer(status, raw)
    assert expected.items() <= answer.items()
    if status == 400:
        assert "prompt too long" in answer["error"]


def test_bootstrap_fields_only_at_the_top_level() -> None:
    assert bootstrap_fields(b'{"prompt": "bootstrap_room"}') == []
    assert bootstrap_fields(b'{"bootstrap_room": 1, "bootstrap_port": null}') == ["bootstrap_room"]
    assert bootstrap_fields(b"not json bootstrap_room") == []


def _args(enabled: bool, peers: str = "") -> argparse.Namespace:
    return argparse.Namespace(sglang_bootstrap=enabled, sglang_bootstrap_peers=peers)


def test_flags() -> None:
    assert config_from_args(_args(False), "decode", 30) is None
    assert config_from_args(_args(True), "prefill", 30).role == "prefill"  # type: ignore[union-attr]
    decode = config_from_args(_args(True, "10.0.0.1:8100,[::1]:9"), "decode", 30)
    assert decode is not None and decode.peers == {("10.0.0.1", 8100), ("::1", 9)}
    for args, role, flag in (
        (_args(True), "decode", "--sglang-bootstrap-peers"),
        (_args(True), "colocated", "--sglang-bootstrap"),
        (_args(False, "h:1"), "decode", "--sglang-bootstrap-peers"),
    ):
        with pytest.raises(ValueError, match=flag):
            config_from_args(args, role, 30)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_peers("host:0")
