"""One child process: output to a log or piped, a line waited for, the ordered stop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relaykv.common.plumbing.child_process import ChildProcess, free_port

CHATTY = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("stopping", flush=True), sys.exit(0)))
print("starting", flush=True)
for i in range(20000):  # far more than a pipe holds: the parent must keep reading
    print("x" * 20)
print("READY 42", flush=True)
time.sleep(60)
"""


def _ready(line: str) -> int | None:
    return int(line.split()[1]) if line.startswith("READY") else None


def test_a_piped_child_gives_its_line_keeps_logging_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = ChildProcess([sys.executable, "-c", CHATTY], log_path=log, pipe=True)
    child.start()
    assert child.wait_for_line(_ready, 30) == 42
    assert child.running
    assert child.stop(30) == 0
    text = log.read_text()
    assert text.startswith("starting\n") and text.endswith("READY 42\nstopping\n")
    assert text.count("x" * 20) == 20000  # and "stopping", after the line waited for


def test_a_child_that_ignores_sigterm_is_killed_and_output_that_ends_is_none(
    tmp_path: Path,
) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('READY 1', flush=True); time.sleep(60)"
    )
    child = ChildProcess([sys.executable, "-c", stubborn], log_path=tmp_path / "a.log", pipe=True)
    child.start()
    assert child.wait_for_line(_ready, 30) == 1
    assert child.stop(0.5) == -9
    quiet = ChildProcess([sys.executable, "-c", "print('no ready line')"], pipe=True)
    quiet.start()
    assert quiet.wait_for_line(_ready, 30) is None
    assert quiet.finish(10) == 0
    slow = ChildProcess([sys.executable, "-c", "import time; time.sleep(60)"], pipe=True)
    slow.start()
    with pytest.raises(TimeoutError):
        slow.wait_for_line(_ready, 0.2)
    assert slow.stop(10) == -15


def test_a_child_asked_on_stdin_exits_by_itself(tmp_path: Path) -> None:
    echo = "import sys\nfor line in sys.stdin:\n    print('got', line.strip(), flush=True)\n"
    child = ChildProcess([sys.executable, "-c", echo], pipe=True, stdin=True)
    child.start()
    child.write("hello\n")
    assert child.readline() == "got hello\n"
    assert child.stop(10, ask=lambda: child.proc.stdin.close()) == 0  # type: ignore[union-attr]
    assert ChildProcess(["x"]).stop(1) is None
    assert 0 < free_port() < 65536
