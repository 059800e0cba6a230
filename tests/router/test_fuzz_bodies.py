"""Fuzzed request bodies through the router to a served P/D pair (reference executors over
the tcp transport): never a 5xx, never a dropped connection, both engines idle afterwards."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from relaykv.engine import LLMEngine
from relaykv.router.app import create_router_app
from relaykv.router.relay import Router
from relaykv.transfer.connector import PDConnector
from relaykv.transfer.transport import get_transport
from tests.serve.body_strategies import fuzz
from tests.serve.harness import ServerThread, free_socket, reference_served

EXAMPLES = 1000
_ids = itertools.count()


def _served(role: str) -> ServerThread:
    name = f"{role}-fuzz-{next(_ids)}"

    def connector(engine: LLMEngine) -> PDConnector:
        buffer = engine.executor.buffer  # type: ignore[attr-defined]
        return PDConnector(
            role, engine.manager, get_transport("tcp"), buffer, engine_id=name, lease_seconds=1.0
        )

    served = reference_served(
        max_model_len=64, num_blocks=200, role=role, connector_factory=connector
    )
    return ServerThread(served, api_key=None)


class RouterThread:
    def __init__(self, router: Router) -> None:
        self.sock = free_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_router_app(router), log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "router did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[RouterThread, ServerThread, ServerThread]]:
    p, d = _served("prefill"), _served("decode")
    router = RouterThread(Router([p.url], [d.url]))
    yield router, p, d
    router.stop()
    d.stop()
    p.stop()


@pytest.mark.slow
def test_fuzzed_bodies_through_the_router_never_get_a_500(cluster) -> None:
    router, p, d = cluster
    with httpx.Client(base_url=router.url, timeout=30) as client:
        ok = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
        assert ok.status_code == 200, ok.text  # the pair works, so bodies reach both hops

        fuzz(client, EXAMPLES)
        metrics = client.get("/metrics").text
    assert 'status="5' not in metrics, metrics
    assert d.idle(), "the decode engine kept requests or blocks"
    # P keeps blocks for D under a lease (1 s here): a body D refuses after P computed it
    # (docs/pd.md) holds them until the lease ends, never longer.
    assert p.idle(timeout=15), "the prefill engine kept requests or blocks"
