"""Supervision (launch/supervisor.py) and the ordered stop (launch/cluster.py) on stand-in
members: small Python processes instead of engines, so each test takes a second."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from relaykv.launch.cluster import Cluster, Member
from relaykv.launch.supervisor import RestartPolicy, Supervisor
from tests.waiting import wait_until

# A member that records its SIGTERM order in a shared file and exits 0 (or crashes at once).
# Once its handler is in place it creates `<order>.<pid>.ready` (`handlers_installed`).
MEMBER = """
import os, signal, sys, time
name, order, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "crash":
    sys.exit(3)
def stop(*_):
    with open(order, "a") as f:
        f.write(name + "\\n")
    time.sleep(0.2)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(f"{order}.{os.getpid()}.ready", "w").close()
while True:
    time.sleep(0.05)
"""


def stand_in(tmp_path: Path, modes: dict[str, str]) -> Cluster:
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    order = tmp_path / "order"
    cluster = Cluster(engine_args=[], log_dir=tmp_path)
    for name, mode in modes.items():
        argv = [sys.executable, str(script), name, str(order), mode]
        cluster.members.append(Member(name, "http://unused", argv, tmp_path / f"{name}.log"))
    for member in cluster.members:
        cluster.launch(member)
    return cluster


def handlers_installed(tmp_path: Path, cluster: Cluster) -> None:
    """Wait until every running stand-in has its SIGTERM handler (a SIGTERM before that would
    kill it with -15 instead of letting it record its turn and exit 0)."""
    running = [m.process.pid for m in cluster.members if m.process and m.process.poll() is None]
    wait_until(lambda: all((tmp_path / f"order.{pid}.ready").exists() for pid in running),
               timeout=60, what="the stand-ins' SIGTERM handlers")


def poll_until(supervisor: Supervisor, done, timeout: float = 10.0) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reason = supervisor.poll()
        assert supervisor.check() == []
        if reason is not None or done():
            return reason
        time.sleep(0.05)
    raise AssertionError("supervisor did not get there in time")


def test_a_dead_member_is_restarted_and_the_others_keep_running(tmp_path: Path) -> None:
    cluster = stand_in(tmp_path, {"prefill0": "run", "prefill1": "run", "decode0": "run",
                                  "router": "run"})
    said: list[str] = []
    deaths: list[int] = []
    supervisor = Supervisor(cluster, RestartPolicy(backoff_s=0.1), said.append,
                            on_death=lambda: deaths.append(1))
    try:
        victim = cluster.members[0]
        others = {m.name: m.process.pid for m in cluster.members[1:]}
        os.kill(victim.process.pid, signal.SIGKILL)
        old_pid = victim.process.pid
        assert poll_until(supervisor, lambda: victim.restarts == 1) is None
        assert victim.process.pid != old_pid and victim.process.poll() is None
        assert {m.name: m.process.pid for m in cluster.members[1:]} == others
        assert deaths == [1]
        assert any("prefill0 exited" in line for line in said)
        handlers_installed(tmp_path, cluster)  # the restarted prefill0 too
    finally:
        codes = cluster.stop(timeout=10, router_timeout=10)
    assert set(codes.values()) == {0}


def test_a_crash_loop_stops_supervision_with_the_reason(tmp_path: Path) -> None:
    cluster = stand_in(tmp_path, {"decode0": "crash", "router": "run"})
    supervisor = Supervisor(cluster, RestartPolicy(backoff_s=0.0, max_restarts=2, window_s=60),
                            lambda _: None)
    try:
        reason = poll_until(supervisor, lambda: False)
        assert reason is not None and "decode0 died 3 times within 60s" in reason
        assert cluster.members[0].restarts == 2
    finally:
        cluster.stop(timeout=10, router_timeout=10)


def test_stop_drains_router_then_prefill_then_decode(tmp_path: Path) -> None:
    cluster = stand_in(tmp_path, {"prefill0": "run", "decode0": "run", "router": "run"})
    handlers_installed(tmp_path, cluster)
    codes = cluster.stop(timeout=10, router_timeout=10)
    assert codes == {"router": 0, "prefill0": 0, "decode0": 0}
    assert (tmp_path / "order").read_text().split() == ["router", "prefill0", "decode0"]
