"""Conditional disaggregation across processes (docs/routing.md "Conditional disaggregation").

One prefill and one decode engine (tiny-hybrid with its EAGLE draft, `--sibling-reach 512`)
behind a router under `--disaggregation conditional`, and a second router under `always` on
the same engines. The first request of a prefix goes P -> D (nothing held on D); a sibling
with a 64-token new suffix goes straight to D, which prefills it itself, with greedy output
identical to the P/D path's; a sibling with a 1,200-token new suffix on the 1,536-token prefix
still goes through P. Each path and its reason are read from the router's decision records.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from relaykv.launch.cluster import Cluster, free_port

pytestmark = pytest.mark.slow

ENGINE_ARGS = ["--model", "tiny-hybrid", "--speculative-tokens", "2", "--sibling-reach", "512",
               "--max-local-prefill-tokens", "128"]
PREFIX = [(k * 7) % 250 + 3 for k in range(1536)]


def _prompt(seed: int, suffix: int) -> list[int]:
    return [*PREFIX, *((seed * 13 + k * 5) % 250 + 3 for k in range(suffix))]


def _complete(url: str, prompt: list[int]) -> list[int]:
    body = {"model": "tiny-hybrid", "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["token_ids"]


def _last_decision(url: str) -> dict:
    recent = httpx.get(f"{url}/routing", params={"recent": 1}, timeout=5).json()["recent"]
    return next(d for d in reversed(recent) if d["role"] == "decode")


def _wait(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {url}/metrics")


def test_siblings_of_a_held_prefix_are_prefilled_on_the_decode_engine(tmp_path: Path) -> None:
    cluster = Cluster(engine_args=ENGINE_ARGS, kv_events=True, log_dir=tmp_path,
                      router_args=["--disaggregation", "conditional"])
    cluster.start(timeout=300)
    port = free_port()
    always = subprocess.Popen(
        [sys.executable, "-m", "relaykv", "router", "--port", str(port),
         "--prefill", cluster.urls("prefill")[0], "--decode", cluster.urls("decode")[0],
         "--disaggregation", "always"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    router, other = cluster.router.url, f"http://127.0.0.1:{port}"
    decode = cluster.urls("decode")[0]
    try:
        _wait(lambda: _ready(other), 60, "the second router")
        _complete(router, _prompt(1, 64))
        first = _last_decision(router)
        assert (first["path"], first["why"]) == ("pd", "no usable hit on the decode engine")

        # D's events reach the router: the sibling's usable hit there is the prefix.
        sibling = _prompt(2, 64)

        def indexed() -> bool:
            engines = httpx.get(f"{router}/routing", timeout=5).json()["engines"]
            return bool(engines[decode]["indexed_blocks"])

        _wait(indexed, 30, "the decode engine's events")
        local = _complete(router, sibling)
        record = _last_decision(router)
        assert record["path"] == "local", record
        # The hit is the prefix less the EAGLE unit (tiny-hybrid's draft drops one, §4).
        suffix = record["local_suffix"]
        assert suffix == 64 + 16 and f"{suffix} <= max suffix 512" in record["why"]
        assert _metric(decode, "relaykv:decode_local_requests_total") == 1
        assert _metric(decode, "relaykv:decode_local_prefill_tokens_total") == suffix

        # The same prompt through P -> D (the `always` router): token-identical.
        assert _complete(other, sibling) == local
        assert _last_decision(other)["path"] == "pd"

        # A long new suffix on the same prefix goes through P.
        _complete(router, _prompt(3, 1200))
        long = _last_decision(router)
        # D holds the 1,536-token prefix: the bound of its hit already proves a suffix of
        # at least 1,200 tokens (the exact one is 1,216), so no lookup ran (-1: unknown).
        assert long["path"] == "pd" and long["local_suffix"] == -1, long
        assert "suffix >= 1200 > max suffix 512" in long["why"]
        assert _metric(decode, "relaykv:decode_local_requests_total") == 1
        paths = httpx.get(f"{router}/routing", timeout=5).json()["disaggregation"]["paths"]
        assert paths == {"local": 1, "pd": 2}
    finally:
        always.terminate()
        always.wait(30)
        cluster.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
