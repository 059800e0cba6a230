"""A cluster sharing a Mooncake Store KV tier (docs/tier.md, "Mooncake Store"): a master, one
prefill and one decode engine (tiny-hybrid with its EAGLE draft, per-group) and a router,
as `relaykv up --kv-offloading-backend mooncake` runs them, supervised.

* After x+a, the decode engine is killed with SIGKILL; once restarted (an empty pool), x+b
  takes at most a quarter of x+a's prompt KV from the prefill engine, the rest from the
  store, and its output equals a colocated engine's.
* The master killed: requests keep succeeding with the same outputs (misses go to P), the
  engines log a warning; restarted, a restarted decode engine hits the store again, at its
  first request: P's puts after the restart went to P's own segment, not to the segment of
  the decode engine that was then killed (docs/tier.md "Mooncake Store", the marker).
* Engines stopped: the master holds no object (no block, no marker) and no segment of theirs.

Skipped with the reason (and the install command) when Mooncake's store is not importable.
"""

from __future__ import annotations

import os
import random
import signal
import time

import httpx
import pytest

from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.launch.cluster import STORE, Cluster, Member
from relaykv.launch.supervisor import RestartPolicy, Supervisor
from relaykv.model import ModelRunner, load_model
from relaykv.serve.assembly.tier_wiring import store_master_member
from relaykv.transfer.tier.mooncake import mooncake_unavailable
from relaykv.transfer.tier.store_keys import MARKER_PREFIX

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(mooncake_unavailable() is not None, reason=str(mooncake_unavailable())),
]

ENGINE_ARGS = ["--model", "tiny-hybrid", "--speculative-tokens", "2", "--num-blocks", "700",
               "--max-model-len", "2048", "--kv-transfer-timeout", "20",
               "--pd-policy", "per-group", "--kv-offloading-backend", "mooncake",
               "--kv-offloading-size", "0.05"]
TOKENS = 8


def _reference(prompts: list[list[int]]) -> list[list[int]]:
    loaded = load_model("tiny-hybrid")
    runner = ModelRunner(loaded.model, num_blocks=400)
    config = EngineConfig(num_blocks=400, scheduler=SchedulerConfig(max_model_len=2048))
    engine = LLMEngine(runner, config, vocab_size=loaded.config.vocab_size)
    params = SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True)
    return [r.output_ids for r in engine.generate(prompts, params)]


def _complete(url: str, prompt: list[int], deadline_s: float = 90) -> list[int]:
    """Greedy tokens through the router, retried while a restarted member comes back."""
    deadline = time.monotonic() + deadline_s
    body = {"model": "tiny-hybrid", "prompt": prompt, "max_tokens": TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    while True:
        resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        if resp.status_code == 200:
            return list(resp.json()["choices"][0]["token_ids"])
        assert time.monotonic() < deadline, resp.text
        time.sleep(0.5)


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _kill_and_restart(cluster: Cluster, supervisor: Supervisor, member: Member) -> None:
    assert member.process is not None
    os.kill(member.process.pid, signal.SIGKILL)
    member.process.wait()
    deadline = time.monotonic() + 120
    while True:
        assert supervisor.poll() is None
        if member.restarts and member.process.poll() is None:
            try:
                if httpx.get(f"{member.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        assert time.monotonic() < deadline, member.log_tail()
        time.sleep(0.2)


def _objects(master: Member) -> list[str]:
    """The master's object names (none while it is not answering)."""
    try:
        text = httpx.get(f"{master.url}/get_all_keys", timeout=5).text
    except httpx.HTTPError:
        return []
    return [k for k in text.splitlines() if k]


def _keys(master: Member) -> list[str]:
    """The blocks in the store (each engine's marker left out)."""
    return [k for k in _objects(master) if not k.startswith(MARKER_PREFIX)]


def _segments(master: Member) -> list[tuple[str, int]]:
    """Each mounted segment and the bytes its objects take."""
    detail = httpx.get(f"{master.url}/get_segments_detail", timeout=5).json()
    return [(s["segment_name"], s["allocator_used_bytes"]) for s in detail["segments"]]


def test_restart_warm_from_the_store_master_loss_and_no_leaks(tmp_path) -> None:
    rng = random.Random(26)
    x, y = ([rng.randrange(1, 256) for _ in range(1024)] for _ in range(2))
    xa, xb, ya, yb = (p + [rng.randrange(1, 256) for _ in range(16)] for p in (x, x, y, y))
    lone = [[rng.randrange(1, 256) for _ in range(200)] for _ in range(3)]
    expected = dict(zip(("xa", "xb", "ya", "yb", "c0", "c1", "c2"),
                        _reference([xa, xb, ya, yb, *lone]), strict=True))

    argv, address, health = store_master_member("127.0.0.1")
    cluster = Cluster(engine_args=[*ENGINE_ARGS, "--kv-store-master", address],
                      router_args=["--disaggregation", "always"], log_dir=tmp_path,
                      store=(argv, health))
    cluster.start(timeout=300)
    supervisor = Supervisor(cluster, RestartPolicy(backoff_s=0.2, max_restarts=5))
    names = {m.name: m for m in cluster.members}
    master, decode, prefill = names[STORE], names["decode0"], names["prefill0"]
    router = cluster.router.url
    try:
        # x+a: D takes its prompt KV from P (and from whatever P's stores already put).
        assert _complete(router, xa) == expected["xa"]
        moved_a = _metric(decode.url, "relaykv:kv_bytes_received_total") + _metric(
            decode.url, "relaykv:kv_bytes_from_tier_total")
        assert moved_a > 0 and _keys(master)

        # kill -9 D; restarted with an empty pool, x+b comes mostly from the store.
        _kill_and_restart(cluster, supervisor, decode)
        assert _complete(router, xb) == expected["xb"]
        from_p = _metric(decode.url, "relaykv:kv_bytes_received_total")
        from_store = _metric(decode.url, "relaykv:kv_bytes_from_tier_total")
        print(f"x+a prompt KV into D {moved_a:.0f} B; x+b after restart: {from_p:.0f} B from "
              f"P, {from_store:.0f} B from the store")
        assert from_store > 0 and from_p * 4 <= moved_a, (from_p, from_store, moved_a)

        # The master killed (not restarted yet): every request succeeds, same outputs.
        assert master.process is not None
        os.kill(master.process.pid, signal.SIGKILL)
        master.process.wait()
        for i, prompt in enumerate(lone):
            assert _complete(router, prompt, deadline_s=5) == expected[f"c{i}"]
        time.sleep(2)
        assert _complete(router, ya, deadline_s=5) == expected["ya"]
        deadline = time.monotonic() + 20  # a call to a dead master takes seconds to fail
        while not any("unreachable" in m.log_path.read_text() for m in (prefill, decode)):
            assert time.monotonic() < deadline, prefill.log_tail(40)
            time.sleep(0.5)

        # The master back: P's stores land again, and a restarted D hits them.
        deadline = time.monotonic() + 60
        while not (master.restarts and master.process.poll() is None):
            assert supervisor.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        while not _keys(master):
            assert time.monotonic() < deadline, "no store after the master came back"
            _complete(router, [*ya, 7])  # P stores what it computes (its index was forgotten)
            time.sleep(0.5)
        # P's puts land one by one off its step (docs/tier.md "Puts"): the first key is not
        # the whole checkpoint chain yet; wait until the keys stop coming.
        settled = len(_keys(master))
        while True:
            time.sleep(1.0)
            now = len(_keys(master))
            if now == settled:
                break
            assert time.monotonic() < deadline, "the store's keys never settled"
            settled = now
        # P's puts after the restart sit in P's segment (before the marker, a put in the
        # second after the restart could land in D's segment, mounted again first, and die
        # with D: the restarted D then got TRANSFER_FAIL and took nothing from the store).
        segments = _segments(master)
        _kill_and_restart(cluster, supervisor, decode)
        assert _complete(router, yb) == expected["yb"]
        assert _metric(decode.url, "relaykv:kv_bytes_from_tier_total") > 0, segments

        # Engines stopped, the master still up: nothing of theirs is left in the store.
        for member in cluster.members:
            if member.role != STORE and member.child is not None:
                assert member.child.stop(60) == 0, member.log_tail()
        assert _objects(master) == []
        segments = httpx.get(f"{master.url}/get_all_segments", timeout=5).text.split()
        assert segments == []
    finally:
        cluster.stop()
