"""Cache-aware routing across processes: affinity, a second router, kill -9 and restart.

One prefill and two decode engines (tiny-hybrid with its EAGLE draft) publish KV events; the
router follows them. Siblings of a prefix land where it is; a second router builds the same
index; a decode engine killed with SIGKILL under load leaves the rotation within 2 s with its
index dropped while every request still gets an answer; restarted, it comes back with an
empty index (a new instance) and is routed to again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from relaykv.launch.cluster import Cluster, free_port

pytestmark = pytest.mark.slow

ENGINE_ARGS = [
    "--model",
    "tiny-hybrid",
    "--speculative-tokens",
    "2",
    "--num-blocks",
    "600",
    "--max-model-len",
    "1024",
    "--kv-transfer-timeout",
    "10",
]


def _body(prefix: int, i: int) -> dict:
    prompt = [(prefix * 7 + k) % 250 + 3 for k in range(320)] + [
        (i * 13 + k) % 250 + 3 for k in range(24)
    ]
    return {
        "model": "tiny-hybrid",
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }


def _wait(cond, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - t0


def _routing(url: str) -> dict:
    return httpx.get(f"{url}/routing", timeout=5).json()


def _decode_health(url: str) -> dict[str, bool]:
    body = httpx.get(f"{url}/health", timeout=5).json()
    return {b["url"]: b["healthy"] for b in body["decode"]}


async def _load(url: str, n: int, concurrency: int = 3, first_prefix: int = 0) -> list[int]:
    statuses: list[int] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> None:
            async with sem:
                try:
                    body = _body(first_prefix + i % 3, i)
                    resp = await client.post(f"{url}/v1/completions", json=body)
                    statuses.append(resp.status_code)
                except httpx.HTTPError:
                    statuses.append(-1)

        await asyncio.gather(*(one(i) for i in range(n)))
    return statuses


# Exclusive: the killed engine must leave the rotation within 2 s, a bound on how fast the
# router reacts that another test's load should not eat into (tests/exclusive.py).
@pytest.mark.exclusive
def test_affinity_second_router_kill_and_restart(tmp_path: Path) -> None:
    cluster = Cluster(
        engine_args=ENGINE_ARGS,
        num_prefill=1,
        num_decode=2,
        kv_events=True,
        router_args=["--routing", "cache-aware"],
        log_dir=tmp_path,
    )
    cluster.start(timeout=300)
    second = None
    try:
        router = cluster.router.url
        _wait(
            lambda: all(
                e["indexed_blocks"] is not None for e in _routing(router)["engines"].values()
            ),
            20,
            "first refresh",
        )
        # Affinity: the siblings of each prefix reuse it on the decode side.
        assert all(s == 200 for s in asyncio.run(_load(router, 12)))
        engines = _routing(router)["engines"]
        decode_urls = cluster.urls("decode")
        assert sum(engines[u]["routed_hit_tokens"] for u in decode_urls) > 0
        assert all(engines[u]["indexed_blocks"] > 0 for u in decode_urls)

        # A second router on the same engines sees the same blocks (late join: replay).
        port = free_port()
        second = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykv",
                "router",
                "--port",
                str(port),
                "--prefill",
                ",".join(cluster.urls("prefill")),
                "--decode",
                ",".join(decode_urls),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        other = f"http://127.0.0.1:{port}"

        def same_index() -> bool:
            try:
                a, b = _routing(router)["engines"], _routing(other)["engines"]
            except httpx.HTTPError:
                return False
            return all(a[u]["indexed_blocks"] == b.get(u, {}).get("indexed_blocks") for u in a)

        _wait(same_index, 30, "the second router's index")

        # kill -9 a decode engine under load.
        victim = next(m for m in cluster.members if m.name == "decode0")
        assert victim.process is not None
        load = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import asyncio, json, sys; from tests.router.test_routing_cluster import _load; "
                f"print(json.dumps(asyncio.run(_load({router!r}, 16))))",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parents[2],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        time.sleep(1.0)
        os.killpg(victim.process.pid, signal.SIGKILL)
        took = _wait(lambda: not _decode_health(router)[victim.url], 2.0, "the router to notice")
        assert took < 2.0
        assert _routing(router)["engines"][victim.url]["indexed_blocks"] == 0
        out, _ = load.communicate(timeout=120)  # nothing hangs
        statuses = json.loads(out)
        assert len(statuses) == 16 and statuses.count(200) >= 16 - 3, statuses

        # Restart it on the same port: back in rotation with a new, empty index.
        before = _routing(router)["engines"][victim.url]["decisions"]
        victim.process.wait(10)
        cluster.launch(victim)
        _wait(lambda: _decode_health(router)[victim.url], 120, "the restarted engine")
        assert _routing(router)["engines"][victim.url]["indexed_blocks"] == 0
        # New prefixes (no hit anywhere) spread on load, so the restarted engine gets some.
        fresh = asyncio.run(_load(router, 8, concurrency=4, first_prefix=10))
        assert all(s == 200 for s in fresh)
        assert _routing(router)["engines"][victim.url]["decisions"] > before
    finally:
        if second is not None:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(30)
        cluster.stop()


def test_events_published_off_the_host_are_followed_over_curve(tmp_path: Path) -> None:
    """Engines publishing on every address (as for a router on another host) use CURVE with
    keys from the cluster secret (the suite's, in every member's environment): the router
    follows them, a plain ZeroMQ subscriber gets nothing (docs/kv-events.md)."""
    import zmq

    events = {"enable_kv_cache_events": True, "endpoint": "tcp://0.0.0.0:*",
              "replay_endpoint": "tcp://0.0.0.0:*"}
    cluster = Cluster(
        engine_args=[*ENGINE_ARGS, "--kv-events-config", json.dumps(events)],
        router_args=["--routing", "cache-aware"],
        log_dir=tmp_path,
    )
    cluster.start(timeout=300)
    ctx = zmq.Context()
    try:
        router = cluster.router.url
        infos = [httpx.get(f"{url}/v1/kv_cache_info", timeout=5).json()["kv_events"]
                 for url in cluster.urls("prefill") + cluster.urls("decode")]
        assert all(i["curve"] and i["endpoint"].startswith("tcp://0.0.0.0:") for i in infos)
        plain = ctx.socket(zmq.SUB)
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        plain.connect(infos[1]["endpoint"].replace("0.0.0.0", "127.0.0.1"))
        assert all(s == 200 for s in asyncio.run(_load(router, 6, concurrency=2)))
        _wait(lambda: all(e["indexed_blocks"] for e in _routing(router)["engines"].values()),
              20, "the router's index over CURVE")
        assert not plain.poll(500)
        plain.close(0)
    finally:
        ctx.term()
        cluster.stop()
