"""The router names the decode engine in its grant request; P binds the signed grant to it
(docs/security.md, "Signed grants"). Served engines (reference executors, tcp transport): one
prefill engine, two decode engines, the real router."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from relaykv.router.relay import Router
from relaykv.serve.api.kv_cache_info import install_kv_cache_info
from tests.serve.harness import ServerThread

from .test_fuzz_bodies import RouterThread, _served

PROMPT = [5, 9, 13, 17, 21, 25, 29, 33] * 5


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[RouterThread, ServerThread, list[ServerThread]]]:
    p, decoders = _served("prefill"), [_served("decode"), _served("decode")]
    for d in decoders:  # `relaykv serve` installs it (serve/cli.py); the harness does not
        install_kv_cache_info(d.app, d.served, None)
    router = RouterThread(Router([p.url], [d.url for d in decoders]))
    yield router, p, decoders
    router.stop()
    for server in (*decoders, p):
        server.stop()


def _complete(url: str, **extra: Any) -> httpx.Response:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


def test_each_decode_engine_gets_grants_for_itself_only(cluster) -> None:
    router, p, decoders = cluster
    seen: dict[str, list[Any]] = {}
    for d in decoders:
        connector = d.served.engine.connector
        own = connector.engine_id
        info = httpx.get(f"{d.url}/v1/kv_cache_info", timeout=10).json()
        assert info["engine_id"] == own  # what the router names
        check = connector.validate

        def spy(params: dict, *args: Any, _own: str = own, _check: Any = check) -> None:
            if params.get("do_remote_prefill"):
                seen.setdefault(_own, []).append(params.get("destination_engine_id"))
            _check(params, *args)

        connector.validate = spy
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: _complete(router.url), range(8)))
    finally:
        for d in decoders:
            del d.served.engine.connector.validate
    assert [a.status_code for a in answers] == [200] * 8
    assert len({a.json()["choices"][0]["text"] for a in answers}) == 1
    assert set(seen) == {d.served.engine.connector.engine_id for d in decoders}  # both used
    for own, destinations in seen.items():
        assert set(destinations) == {own}, (own, destinations)
    assert all(d.idle() for d in decoders) and p.idle(timeout=15)


def test_a_grant_for_one_decode_engine_is_refused_by_the_other(cluster) -> None:
    router, p, (d0, d1) = cluster
    expected = _complete(router.url).json()["choices"][0]["text"]
    target = d0.served.engine.connector.engine_id
    grant = _complete(
        p.url, kv_transfer_params={"do_remote_decode": True, "destination_engine_id": target}
    ).json()["kv_transfer_params"]
    assert grant["destination_engine_id"] == target
    refused = _complete(d1.url, kv_transfer_params=grant)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "kv_transfer_params" and "issued for engine" in error["message"]
    assert d1.idle()  # nothing allocated or read
    accepted = _complete(d0.url, kv_transfer_params=grant)
    assert accepted.status_code == 200 and accepted.json()["choices"][0]["text"] == expected
    assert d0.idle() and p.idle(timeout=15)


def test_a_salted_request_through_the_router(cluster) -> None:
    """D checks the grant's block hashes with the request's cache salt (as P computed them)."""
    router = cluster[0]
    plain = _complete(router.url)
    salted = _complete(router.url, cache_salt="tenant-a")
    assert salted.status_code == 200, salted.text
    assert salted.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
