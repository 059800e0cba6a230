"""Starting and stopping the `up` subprocess (with the stub `up`, loopback only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relaykv.bench.ab.cluster import ClusterProcess, ClusterStartError

STUB_UP = [sys.executable, str(Path(__file__).parent.parent / "stub_cluster.py")]


def test_start_reads_the_json_line_and_sigterm_stops_it(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with ClusterProcess([*STUB_UP, "--json"], log, ready_timeout_s=30) as cluster:
        assert cluster.urls is not None
        assert cluster.urls.router.startswith("http://127.0.0.1:")
        assert cluster.urls.decode == (cluster.urls.router,)
        proc = cluster.proc
    assert proc is not None and proc.returncode == 0  # exited cleanly on SIGTERM
    text = log.read_text()
    assert "a log line before the JSON" in text and "stub up: stopped" in text


def test_exit_before_the_json_line_is_an_error_with_the_log_tail(tmp_path: Path) -> None:
    cluster = ClusterProcess([*STUB_UP, "--json", "--fail-start"], tmp_path / "up.log")
    with pytest.raises(ClusterStartError, match="status 3") as info:
        cluster.start()
    assert "refusing to start" in str(info.value)


def test_no_json_line_in_time_is_an_error_and_the_process_is_stopped(tmp_path: Path) -> None:
    cluster = ClusterProcess(
        [sys.executable, "-c", "import time; print('hi'); time.sleep(60)"],
        tmp_path / "up.log",
        ready_timeout_s=0.5,
        stop_timeout_s=5,
    )
    with pytest.raises(ClusterStartError, match="no cluster JSON line"):
        cluster.start()
    assert cluster.proc is not None and cluster.proc.poll() is not None


def test_a_child_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    script = (
        "import signal, time, json; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(json.dumps({'router': 'http://127.0.0.1:1', 'prefill': [], "
        "'decode': []}), flush=True); time.sleep(60)"
    )
    cluster = ClusterProcess(
        [sys.executable, "-c", script], tmp_path / "up.log", ready_timeout_s=30, stop_timeout_s=0.5
    )
    cluster.start()
    assert cluster.stop() == -9


def test_missing_command_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterStartError, match="cannot run"):
        ClusterProcess(["/nonexistent/relaykv", "up"], tmp_path / "up.log").start()
