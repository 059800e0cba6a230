"""Fuzzed request bodies against the engine's server: never a 5xx, never a dropped
connection, and the engine idle with every block free afterwards (the reference executor
keeps each example to milliseconds)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ..body_strategies import fuzz
from ..harness import ServerThread, reference_served

EXAMPLES = 1000


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[ServerThread]:
    srv = ServerThread(reference_served(max_model_len=64, num_blocks=200), api_key=None)
    yield srv
    srv.stop()


@pytest.mark.slow
def test_fuzzed_bodies_never_get_a_500(fuzzed: ServerThread) -> None:
    with httpx.Client(base_url=fuzzed.url, timeout=30) as client:
        fuzz(client, EXAMPLES)
    assert fuzzed.idle(), "a fuzzed request left blocks or requests behind"
    assert httpx.get(f"{fuzzed.url}/health").status_code == 200
