"""A `relaykv up` killed by SIGKILL leaves no orphaned members (docs/security.md, "Faults and
what they cost"): members are launched with a parent-death signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.waiting import wait_until

# A launcher that starts one member the way `relaykv up` does (Cluster.launch), prints the
# member's pid, then waits to be killed. The member is a plain sleeper: no model, no ports.
LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from relaykv.launch.cluster import Cluster, Member
    cluster = Cluster(engine_args=[])
    member = Member("decode0", "http://127.0.0.1:1",
                    [sys.executable, "-c", "import time; time.sleep(120)"],
                    Path(sys.argv[1]))
    cluster.launch(member)
    print(member.process.pid, flush=True)
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has exited all the same.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals are Linux-only")
def test_members_die_with_a_killed_launcher(tmp_path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path / "member.log")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert launcher.stdout is not None
        member_pid = int(launcher.stdout.readline())
        assert _alive(member_pid)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        wait_until(lambda: not _alive(member_pid), timeout=20, what="the member to exit")
    finally:
        launcher.kill()
        launcher.wait(timeout=30)
