"""`relaykv up` leaves nothing in the temp directory: its runtime directory (the cluster's KV
secret, the KV event sockets) goes on a signal (SIGTERM, SIGINT, SIGHUP, also during
startup) and on a failed start; the default log directory goes when every member exited 0
and stays, named, otherwise; what an `up` killed with SIGKILL left, the next `up` removes,
never a live one's (launch/run_dir.py).

The real `relaykv up` runs with stand-in members (a small HTTP server per member that binds
the KV event sockets it is given), so a test takes a second or two; each test gets its own
$TMPDIR."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.waiting import wait_until

# A member: answers /health on its --port (503 with STANDIN_NEVER_READY), binds the unix
# sockets of its --kv-events-config like an engine, marks `<name>.<pid>.started` in
# STANDIN_DIR once its SIGTERM handler is in place, exits 0 on SIGTERM; the member named by
# STANDIN_CRASH exits 3 at once.
MEMBER = textwrap.dedent(
    """
    import http.server, json, os, signal, socket, sys, threading
    argv = sys.argv[1:]
    name = "router" if argv[0] == "router" else argv[argv.index("--role") + 1] + "0"
    if os.environ.get("STANDIN_CRASH") == name:
        sys.exit(3)
    sockets = []
    if "--kv-events-config" in argv:
        config = json.loads(argv[argv.index("--kv-events-config") + 1])
        for key in ("endpoint", "replay_endpoint"):
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(config[key].removeprefix("ipc://"))
            sock.listen()
            sockets.append(sock)
    status = 503 if os.environ.get("STANDIN_NEVER_READY") else 200

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Health)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    open(os.path.join(os.environ["STANDIN_DIR"], f"{name}.{os.getpid()}.started"), "w").close()
    server.serve_forever()
    """
)

# `relaykv up` itself, its members replaced by MEMBER.
UP = textwrap.dedent(
    """
    import sys
    from relaykv.launch.cluster import Cluster
    Cluster._command = lambda self: [sys.executable, sys.argv[1]]
    from relaykv.cli import main
    sys.exit(main(["up", *sys.argv[2:]]))
    """
)

SOCKETS = {"prefill0-events", "prefill0-replay", "decode0-events", "decode0-replay"}


class StandIns:
    """`relaykv up` runs with stand-in members and a private temp directory."""

    def __init__(self, root: Path) -> None:
        self.tmp = root / "t"  # short: the sockets' paths must fit a sockaddr_un
        self.marks = root / "marks"
        self.tmp.mkdir()
        self.marks.mkdir()
        self.member = root / "member.py"
        self.member.write_text(MEMBER)
        self.procs: list[subprocess.Popen[str]] = []

    def up(self, *flags: str, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", UP, str(self.member), "--json", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TMPDIR": str(self.tmp), "STANDIN_DIR": str(self.marks),
                 "PYTHONUNBUFFERED": "1", **env},
        )
        self.procs.append(proc)
        return proc

    def ready(self, proc: subprocess.Popen[str]) -> dict:
        """The JSON line of `proc` (it blocks until every member answers /health)."""
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        return json.loads(line)

    def run_dirs(self) -> list[Path]:
        return sorted(self.tmp.glob("relaykv-run-*"))

    def log_dirs(self) -> list[Path]:
        return sorted(self.tmp.glob("relaykv-up-*"))

    def member_pids(self) -> list[int]:
        return [int(p.name.split(".")[1]) for p in self.marks.iterdir()]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=60)
        wait_until(lambda: not any(_alive(pid) for pid in self.member_pids()), timeout=30,
                   what="every stand-in member to exit")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture
def standins(tmp_path_factory: pytest.TempPathFactory):
    standins = StandIns(tmp_path_factory.mktemp("up"))
    yield standins
    standins.close()


def _runtime_dir_is_private(run_dir: Path) -> None:
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "kv-secret").stat().st_mode) == 0o600
    assert {p.name for p in run_dir.iterdir()} == {"kv-secret", "lock", *SOCKETS}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_stops_up_and_leaves_nothing(standins: StandIns, sig: int) -> None:
    proc = standins.up()
    standins.ready(proc)
    (run_dir,) = standins.run_dirs()
    _runtime_dir_is_private(run_dir)
    (log_dir,) = standins.log_dirs()
    assert {p.name for p in log_dir.iterdir()} == {"prefill0.log", "decode0.log", "router.log"}
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "every member exited 0" in err
    assert list(standins.tmp.iterdir()) == []  # the runtime directory and the logs


def test_a_failed_start_removes_the_runtime_dir_and_keeps_the_logs(standins: StandIns) -> None:
    proc = standins.up(STANDIN_CRASH="decode0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "decode0 exited with status 3 during startup" in err
    assert standins.run_dirs() == []
    (log_dir,) = standins.log_dirs()
    assert f"logs kept in {log_dir}" in err
    assert (log_dir / "decode0.log").exists()


def test_a_signal_during_startup_stops_up_at_once(standins: StandIns) -> None:
    """Members that never answer /health and a startup timeout of 10 minutes: SIGTERM stops
    the cluster now, not once startup gives up."""
    proc = standins.up("--startup-timeout", "600", STANDIN_NEVER_READY="1")
    wait_until(lambda: len(standins.member_pids()) == 3, timeout=60,
               what="every member to start")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "asked to stop before every member was ready" in err
    assert standins.run_dirs() == []
    assert not any(_alive(pid) for pid in standins.member_pids())


def test_the_next_up_removes_what_a_killed_up_left(standins: StandIns, tmp_path: Path) -> None:
    """(That it never removes a live `up`'s directory: tests/launch/test_run_dir.py.) The
    next `up` keeps the logs of a given --log-dir."""
    killed = standins.up()
    standins.ready(killed)
    killed.kill()
    killed.wait(timeout=60)
    (left,) = standins.run_dirs()  # SIGKILL: its directory, secret and all, stays
    assert (left / "kv-secret").exists()
    proc = standins.up("--log-dir", str(tmp_path / "logs"))
    standins.ready(proc)
    (run_dir,) = standins.run_dirs()
    assert run_dir != left and not left.exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert {p.name for p in (tmp_path / "logs").iterdir()} == {"prefill0.log", "decode0.log",
                                                                "router.log"}
    # The killed `up`'s logs stay (not secret; a human may want them); nothing else does.
    assert standins.run_dirs() == [] and len(standins.log_dirs()) == 1
