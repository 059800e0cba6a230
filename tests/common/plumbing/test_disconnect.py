"""The disconnect guard: the work's result, or ClientGone with the work cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from relaykv.common.plumbing.disconnect import ClientGone, unless_disconnected


def _request(leaves: asyncio.Event) -> Request:
    async def receive() -> dict[str, Any]:
        await leaves.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


def test_work_that_finishes_first_returns_its_result() -> None:
    async def main() -> int:
        return await unless_disconnected(_request(asyncio.Event()), asyncio.sleep(0, 7))

    assert asyncio.run(main()) == 7


def test_a_client_that_leaves_first_cancels_the_work() -> None:
    cancelled = asyncio.Event()

    async def work() -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    async def main() -> None:
        leaves = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, leaves.set)
        with pytest.raises(ClientGone):
            await unless_disconnected(_request(leaves), work())
        assert cancelled.is_set()

    asyncio.run(main())


def test_the_work_s_own_error_passes_through() -> None:
    async def fails() -> None:
        raise ValueError("engine said no")

    async def main() -> None:
        await unless_disconnected(_request(asyncio.Event()), fails())

    with pytest.raises(ValueError, match="engine said no"):
        asyncio.run(main())
