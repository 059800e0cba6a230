"""`relaykv up --json`: one JSON line once every member is ready; SIGTERM stops them all."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import httpx
import pytest

from relaykv.launch.cluster import Cluster
from relaykv.serve.assembly.cpu_threads import colocated_engine_env


@pytest.mark.slow
def test_up_prints_one_json_line_then_stops_on_sigterm(tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykv", "up", "--json", "--num-blocks", "300",
         "--max-model-len", "1024", "--kv-transport", "tcp", "--log-dir", str(tmp_path),
         "--torch-threads", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**{k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"},
             "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline()  # blocks until the cluster is ready (or up exits)
        info = json.loads(line)
        assert set(info) == {"router", "prefill", "decode"}
        assert len(info["prefill"]) == 1 and len(info["decode"]) == 1
        assert info["router"].startswith("http://127.0.0.1:")
        assert httpx.get(f"{info['router']}/cluster", timeout=5).json()["decode"] == info["decode"]
        resp = httpx.post(f"{info['router']}/v1/completions", timeout=60, json={
            "model": "tiny-hybrid", "prompt": [5, 6, 7, 8], "max_tokens": 3})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == ""  # exactly one line on stdout
        for url in (info["router"], *info["prefill"], *info["decode"]):
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"{url}/health", timeout=2)
        assert {p.name for p in tmp_path.iterdir()} == {"prefill0.log", "decode0.log",
                                                        "router.log"}
        for engine in ("prefill0", "decode0"):  # the flag beats the suite's OMP_NUM_THREADS=1
            log = (tmp_path / f"{engine}.log").read_text()
            assert "torch threads: 2 (OMP_WAIT_POLICY=PASSIVE)" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_rejects_bad_counts() -> None:
    proc = subprocess.run([sys.executable, "-m", "relaykv", "up", "--num-decode", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--num-prefill/--num-decode" in proc.stderr


def test_colocated_engines_get_a_passive_openmp_wait_policy_unless_set() -> None:
    assert colocated_engine_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert colocated_engine_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {}


def test_kv_events_are_ipc_sockets_in_a_private_runtime_directory(tmp_path) -> None:
    """With cache-aware routing `up`'s engines publish events and replay on ipc sockets in a
    0700 directory (no TCP port another uid could reach; docs/security.md, "Listeners")."""
    cluster = Cluster(engine_args=[], num_prefill=1, num_decode=2, kv_events=True,
                      log_dir=tmp_path)
    cluster.plan()
    run_dir = cluster.run_dir
    assert run_dir is not None and stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    endpoints = []
    for member in cluster.members[:-1]:  # the engines; the router last
        config = json.loads(member.argv[member.argv.index("--kv-events-config") + 1])
        assert config["enable_kv_cache_events"] and config["publisher"] == "zmq"
        endpoints += [config["endpoint"], config["replay_endpoint"]]
        assert config["endpoint"] == f"ipc://{run_dir}/{member.name}-events"
        assert config["replay_endpoint"] == f"ipc://{run_dir}/{member.name}-replay"
    assert len(set(endpoints)) == 6
    assert "--kv-events-config" not in cluster.members[-1].argv
    cluster.stop()
    assert not run_dir.exists()  # the cluster made it, the cluster removes it
