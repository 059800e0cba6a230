from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from .harness import API_KEY, ServerThread, reference_served


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    srv = ServerThread(reference_served())
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def http(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
        yield c


@pytest.fixture(autouse=True)
def _settled(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test leaves the engine idle with all blocks free (no leaks, no stragglers)."""
    yield
    if "server" in request.fixturenames:
        srv: ServerThread = request.getfixturevalue("server")
        srv.executor.delay = 0.0
        assert srv.idle(), "the engine still holds requests or blocks after the test"
