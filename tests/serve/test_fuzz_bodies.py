"""Fuzzed request bodies against the engine's server: never a 5xx, never a dropped
connection, and the engine idle with every block free afterwards (the reference executor
keeps each example to milliseconds)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from .body_strategies import check_answer, requests
from .harness import ServerThread, reference_served

EXAMPLES = 1000


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[ServerThread]:
    srv = ServerThread(reference_served(max_model_len=64, num_blocks=200), api_key=None)
    yield srv
    srv.stop()


def test_fuzzed_bodies_never_get_a_500(fuzzed: ServerThread) -> None:
    with httpx.Client(base_url=fuzzed.url, timeout=30) as client:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(requests)
        def one(request: tuple[str, bytes]) -> None:
            path, raw = request
            resp = client.post(path, content=raw, headers={"Content-Type": "application/json"})
            check_answer(resp.status_code, resp.text)

        one()
    assert fuzzed.idle(), "a fuzzed request left blocks or requests behind"
    assert httpx.get(f"{fuzzed.url}/health").status_code == 200
