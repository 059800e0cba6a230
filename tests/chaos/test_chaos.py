"""Chaos suite (issue #10): one supervised `relaykv up` cluster (2 prefill + 2 decode engines,
shm transport, an API key from a file) on tiny-hybrid, and every fault in turn: forged grants,
another user at the transfer port and the shared memory, oversized and malformed bodies,
client disconnects, a SIGSTOPped prefill engine, kill -9 of each member type under load, kill
-9 of a decode engine while it prefills local requests (conditional disaggregation), and
SIGTERM under load. After each: greedy outputs unchanged, no request lost where a retry is
possible, no KV block and no /dev/shm file leaked. docs/security.md has the figures."""

from __future__ import annotations

import asyncio
import os
import pwd
import random
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.waiting import wait_until

from .attacker import attack_as_nobody
from .harness import UpCluster, run_load

pytestmark = pytest.mark.slow

API_KEY = "chaos-api-key-" + "7" * 20
ENGINE_ARGS = ["--num-prefill", "2", "--num-decode", "2", "--num-blocks", "400",
               "--max-model-len", "1024", "--kv-transfer-timeout", "4", "--prefill-timeout", "4",
               "--max-restarts", "10", "--drain-timeout", "60",
               # grants the tests take from P and never let D read are freed at lease
               # expiry; a short lease keeps each check's settling short (CI time)
               "--kv-lease-seconds", "8",
               # decode engines take local requests however many streams they run and
               # however much local prefill they have queued, so the kill below hits several
               # at once (the defaults send siblings via P to a D that decodes or is queued)
               "--conditional-max-running", "64", "--conditional-max-queued-prefill", "4096"]
AUTH = {"authorization": f"Bearer {API_KEY}"}


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, 256) for _ in range(64)]
    return [shared + [rng.randrange(1, 256) for _ in range(rng.randrange(8, 120))]
            for _ in range(n)]


PROMPTS = _prompts(6, 1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> UpCluster:
    logs = tmp_path_factory.mktemp("chaos-up")
    key_file = logs / "api-key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, API_KEY.encode())
    os.close(fd)
    up = UpCluster([*ENGINE_ARGS, "--api-key-file", str(key_file)], logs).start()
    up.expected = _outputs(up, PROMPTS)  # type: ignore[attr-defined]
    yield up
    if up.proc.poll() is None:
        up.stop()


def _outputs(up: UpCluster, prompts: list[list[int]]) -> list[list[int]]:
    outcomes = asyncio.run(run_load(up.router, prompts, 4, headers=AUTH))
    assert all(o.status == 200 for o in outcomes), [o.error for o in outcomes]
    return [o.token_ids for o in outcomes]


def _unchanged(up: UpCluster) -> None:
    assert _outputs(up, PROMPTS) == up.expected  # type: ignore[attr-defined]
    up.settled()
    assert up.leaked_shm() == []


def _grant(up: UpCluster, prompt: list[int], destination: str | None = None) -> dict:
    kv: dict = {"do_remote_decode": True}
    if destination is not None:
        kv["destination_engine_id"] = destination
    resp = httpx.post(f"{up.info['prefill'][0]}/v1/completions", headers=AUTH, timeout=30, json={
        "model": "tiny-hybrid", "prompt": prompt, "max_tokens": 4, "kv_transfer_params": kv})
    assert resp.status_code == 200, resp.text
    return resp.json()["kv_transfer_params"]


def _decode_with(up: UpCluster, prompt: list[int], params: dict, d: int = 0) -> httpx.Response:
    return httpx.post(f"{up.info['decode'][d]}/v1/completions", headers=AUTH, timeout=30, json={
        "model": "tiny-hybrid", "prompt": prompt, "max_tokens": 4, "kv_transfer_params": params})


def test_forged_and_misapplied_grants_are_refused(cluster: UpCluster) -> None:
    a, b = PROMPTS[0], PROMPTS[1][: len(PROMPTS[0])]
    grant = _grant(cluster, a)
    resp = _decode_with(cluster, b, grant)  # issue #10 item 2: A's KV under B's hashes
    assert resp.status_code == 400 and "different prompt" in resp.json()["error"]["message"]
    forged = {**grant, "remote_block_ids": [[[0, 1]] for _ in grant["remote_block_ids"]]}
    resp = _decode_with(cluster, a, forged)
    assert resp.status_code == 400 and "not signed" in resp.json()["error"]["message"]
    # a grant for one decode engine (as the router asks for it) presented to the other
    first = httpx.get(f"{cluster.info['decode'][0]}/v1/kv_cache_info", headers=AUTH,
                      timeout=10).json()["engine_id"]
    bound = _grant(cluster, a, destination=first)
    resp = _decode_with(cluster, a, bound, d=1)
    assert resp.status_code == 400 and "issued for engine" in resp.json()["error"]["message"]
    assert _decode_with(cluster, a, bound, d=0).status_code == 200
    _unchanged(cluster)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop a child to uid nobody")
def test_another_user_cannot_write_kv_or_use_the_transfer_port(cluster: UpCluster) -> None:
    pwd.getpwuid(65534)
    decode_pid = cluster.pids()[cluster.info["decode"][0]]
    environ = Path(f"/proc/{decode_pid}/environ").read_bytes().split(b"\0")
    secret_file = next(e.split(b"=", 1)[1].decode() for e in environ
                       if e.startswith(b"RELAYKV_KV_SECRET_FILE="))
    secret = Path(secret_file).read_text().strip()
    shm = [f"/dev/shm/{n}" for n in os.listdir("/dev/shm")
           if any(f"relaykv-{pid}-" in n for pid in cluster.pids().values())]
    assert shm, "the decode engines' KV files should exist"
    grant = _grant(cluster, PROMPTS[2])  # leaked to the attacker
    import msgspec

    from relaykv.transfer.transport.planes.shm import ShmRegistration

    victim = next(n for n in shm if f"relaykv-{decode_pid}-" in n)
    report = attack_as_nobody({
        "shm_files": shm, "secret_file": secret_file, "pids": list(cluster.pids().values()),
        "needles": [API_KEY, secret],
        "endpoint": f"tcp://{grant['source']['host']}:{grant['source']['port']}",
        "registration": msgspec.msgpack.encode(ShmRegistration(
            os.path.basename(victim), int(grant["source"]["layout"][1]), True)),
        "request_id": grant["remote_request_id"],
        "pages": [[g, b, b, int(grant["source"]["layout"][2 + g])]
                  for g, pairs in enumerate(grant["remote_block_ids"]) for _, b in pairs[:1]],
    })
    assert report["uid"] == 65534
    assert all(line.startswith("denied") for line in report["shm_writes"]), report
    assert report["secret_read"].startswith("denied"), report
    assert report["cmdline_leaks"] == [], "a secret is visible on a command line"
    assert report["transfer_replies"] == 0  # unauthenticated: not even a refusal
    _unchanged(cluster)


def test_oversized_and_malformed_bodies(cluster: UpCluster) -> None:
    url = f"{cluster.router}/v1/completions"
    huge = b'{"model": "tiny-hybrid", "prompt": "' + b"a" * (9 << 20) + b'"}'
    assert httpx.post(url, content=huge, headers=AUTH, timeout=30).status_code == 413
    for raw in (b'{"prompt": "\\ud800", "max_tokens": 2}', b"[" * 100_000 + b"]" * 100_000):
        assert httpx.post(url, content=raw, headers=AUTH, timeout=30).status_code == 400
    resp = httpx.post(url, headers=AUTH, timeout=30, json={  # D would refuse: so does P, first
        "model": "tiny-hybrid", "prompt": PROMPTS[0], "max_tokens": 5000})
    assert resp.status_code == 400
    _unchanged(cluster)


def test_client_disconnects_abort_on_every_hop(cluster: UpCluster) -> None:
    async def leave_early(stream: bool) -> None:
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as client:
            body = {"model": "tiny-hybrid", "prompt": PROMPTS[3], "max_tokens": 800,
                    "ignore_eos": True, "stream": stream}
            task = asyncio.ensure_future(client.post(f"{cluster.router}/v1/completions",
                                                     json=body))
            await asyncio.sleep(1.0)
            task.cancel()  # the client goes away mid-generation

    async def both() -> None:
        await asyncio.gather(*(leave_early(s) for s in (False, False, True, True)))

    started = time.monotonic()
    asyncio.run(both())
    cluster.settled(timeout=20)  # 800 tokens each would take far longer
    assert time.monotonic() - started < 20
    _unchanged(cluster)


# Exclusive (tests/exclusive.py): a busy other worker slows the surviving engines' health
# answers past the router's 2 s probe timeout, which this test would read as a lost request.
@pytest.mark.exclusive
def test_sigstop_of_a_prefill_engine_mid_transfer(cluster: UpCluster) -> None:
    victim = cluster.info["prefill"][0]
    pid = cluster.pids()[victim]

    async def load_with_stop() -> list:
        loop = asyncio.get_running_loop()
        load = asyncio.ensure_future(run_load(cluster.router, _prompts(16, 5), 8, headers=AUTH))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGSTOP)
        await loop.run_in_executor(None, time.sleep, 5)
        os.kill(pid, signal.SIGCONT)
        return await load

    outcomes = asyncio.run(load_with_stop())
    assert [o.status for o in outcomes] == [200] * len(outcomes), [o.error for o in outcomes]
    assert max(o.seconds for o in outcomes) < 30  # nobody waits out a 600 s timeout
    cluster.wait_healthy(victim)
    _unchanged(cluster)


@pytest.mark.exclusive  # as the SIGSTOP test
@pytest.mark.parametrize("role", ["prefill", "decode", "router"])
def test_kill9_under_load(cluster: UpCluster, role: str) -> None:
    victim = cluster.router if role == "router" else cluster.info[role][1]

    async def load_with_kill() -> tuple[list, int, float]:
        load = asyncio.ensure_future(run_load(cluster.router, _prompts(16, 7), 8, headers=AUTH))
        await asyncio.sleep(0.7)
        pid, killed_at = cluster.kill(victim), time.monotonic()
        return await load, pid, killed_at

    outcomes, pid, killed_at = asyncio.run(load_with_kill())
    cluster.wait_healthy(victim, timeout=30, not_pid=pid)
    back = time.monotonic() - killed_at  # from SIGKILL to /health from the new process
    # Back at all, in bounded time; the < 15 s acceptance figure is measured by
    # benchmarks/chaos_acceptance.py on a quiet machine, not asserted on a shared CI box.
    assert back < 90
    ok = sum(o.status == 200 for o in outcomes)
    if role == "router":  # no one retries for a client whose router died
        assert all(o.status in (200, -1) for o in outcomes)
    else:  # the router retries on the other engine, D recomputes what P can no longer send
        assert ok == len(outcomes), [o.error for o in outcomes if o.status != 200]
    # The router's next health check puts the engine back into rotation.
    wait_until(lambda: _all_in_rotation(cluster), timeout=30, interval=0.05,
               what="the router to route to every engine again")
    _unchanged(cluster)


def _paths(up: UpCluster) -> dict[str, int]:
    body = httpx.get(f"{up.router}/routing", headers=AUTH, timeout=5).json()
    return body["disaggregation"]["paths"]


@pytest.mark.exclusive  # as the other kills
def test_kill9_of_a_decode_engine_while_local_requests_run(cluster: UpCluster) -> None:
    """`relaykv up` runs conditional disaggregation: siblings of a prefix the decode engines
    hold are prefilled there (local requests). One decode engine killed while they run:
    every request completes (a local one whose engine died goes through P to the other),
    with the greedy tokens of the quiet run, and nothing leaks."""
    prompts = _prompts(24, 11)
    quiet = asyncio.run(run_load(cluster.router, prompts, 4, max_tokens=24, headers=AUTH))
    assert all(o.status == 200 for o in quiet), [o.error for o in quiet]
    before = _paths(cluster)
    victim = cluster.info["decode"][1]

    async def load_with_kill() -> tuple[list, int]:
        load = asyncio.ensure_future(
            run_load(cluster.router, prompts, 8, max_tokens=24, headers=AUTH)
        )
        await asyncio.sleep(0.5)
        pid = cluster.kill(victim)
        return await load, pid

    outcomes, pid = asyncio.run(load_with_kill())
    assert [o.status for o in outcomes] == [200] * len(prompts), [o.error for o in outcomes]
    assert [o.token_ids for o in outcomes] == [o.token_ids for o in quiet]
    assert _paths(cluster)["local"] > before["local"]  # the siblings ran on D
    cluster.wait_healthy(victim, timeout=60, not_pid=pid)
    wait_until(lambda: _all_in_rotation(cluster), timeout=30, interval=0.05,
               what="the router to route to every engine again")
    _unchanged(cluster)  # outputs, no request or KV block left on any engine, no shm file


def _all_in_rotation(up: UpCluster) -> bool:
    try:
        body = httpx.get(f"{up.router}/health", headers=AUTH, timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    return all(b["healthy"] for role in ("prefill", "decode") for b in body[role])


def test_sigterm_under_load_drains_and_every_member_exits_0(cluster: UpCluster) -> None:
    async def load_then_stop() -> tuple[list, int]:
        loop = asyncio.get_running_loop()
        load = asyncio.ensure_future(run_load(cluster.router, _prompts(16, 9), 16, max_tokens=48,
                                              headers=AUTH))
        await asyncio.sleep(1.0)  # all 16 are in flight at the router
        code = await loop.run_in_executor(None, cluster.stop)
        return await load, code

    outcomes, code = asyncio.run(load_then_stop())
    assert code == 0
    assert [o.status for o in outcomes] == [200] * 16, [o.error for o in outcomes]
    assert "every member exited 0" in cluster.up_log()
    assert cluster.leaked_shm() == []
