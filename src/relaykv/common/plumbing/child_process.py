"""One child process, started and stopped the same way by everything that runs one: the
members of `relaykv up`, the cluster and front end of `relaykv bench ab`, the cluster of
`relaykv sim calibrate` and the standalone transport peer.

A child runs in its own session, so stopping it can kill everything it started without
touching anything else. Its output is appended to a log file, or piped to the parent
(`readline`, or `wait_for_line`, which keeps draining and logging the output after the line
it waited for, so a chatty child never blocks on a full pipe). With `die_with_parent` the
child gets SIGTERM when the thread that launched it dies (Linux), so a launcher killed with
SIGKILL leaves no orphan holding ports and memory.

`stop` asks the child to exit (SIGTERM, to its whole process group or, with
`signal_group=False`, to the child alone, which then stops its own children; or another
way, e.g. a command on its stdin), waits, and SIGKILLs the process group after the timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Resolved before any fork: the child only calls it (no dynamic loading between fork and exec).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """Run in the child between fork and exec: SIGTERM it (it drains and exits) when the
    thread that launched it dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a child to listen on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ChildProcess:
    """`argv` as a child process: `start()`, `stop(timeout_s)`; `proc` is the running Popen."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path | None = None,
        pipe: bool = False,
        stdin: bool = False,
        env: Mapping[str, str] | None = None,
        signal_group: bool = True,
        die_with_parent: bool = False,
        own_stderr: bool = False,
    ) -> None:
        """`log_path`: where the output goes (appended; with `pipe`, what the parent reads
        is copied there by `wait_for_line`); `pipe`: the output is read by the parent;
        `stdin`: the parent writes to the child (`write`), else it reads nothing; `env`:
        the whole environment (None: the parent's); `own_stderr`: the child's stderr stays
        the parent's (else it joins the output)."""
        self.argv = list(argv)
        self.log_path = log_path
        self.pipe = pipe
        self.stdin = stdin
        self.env = None if env is None else dict(env)
        self.signal_group = signal_group
        self.die_with_parent = die_with_parent
        self.own_stderr = own_stderr
        self.proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self._drain: threading.Thread | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def start(self) -> None:
        """Start the child (again, after it exited); OSError if it cannot run."""
        stdout: int | IO[str] = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("a", encoding="utf-8")
        if self.pipe:
            stdout = subprocess.PIPE
        elif self._log is not None:
            stdout = self._log
        die_with_parent = self.die_with_parent and _PRCTL is not None
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL,
                stdout=stdout,
                stderr=None if self.own_stderr else subprocess.STDOUT,
                text=True,
                bufsize=1,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent if die_with_parent else None,
            )
        except OSError:
            self._close_log()
            raise
        finally:
            if not self.pipe:
                self._close_log()  # the child holds its own copy of the file

    # -- talking to it -------------------------------------------------------------------
    def write(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def readline(self) -> str:
        """The next line of its output ('' once it ended)."""
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.readline()

    def wait_for_line(self, match: Callable[[str], T | None], timeout_s: float | None) -> T | None:
        """The first `match(line)` that is not None; None if the output ended first;
        TimeoutError after `timeout_s`. Every line, before and after, goes to the log."""
        found: list[T | None] = []
        ready = threading.Event()

        def drain() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                log = self._log
                if log is not None and not log.closed:  # stop() may give up on a stuck pipe
                    log.write(line)
                    log.flush()
                if not ready.is_set() and (value := match(line)) is not None:
                    found.append(value)
                    ready.set()
            ready.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"`{self.command}`: no line expected within {timeout_s:g} s")
        return found[0] if found else None

    # -- its state -----------------------------------------------------------------------
    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None:
            return ""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- stopping it ---------------------------------------------------------------------
    def signal_stop(self) -> None:
        """SIGTERM to the child's process group (or to the child alone), if it runs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.signal_group:
                os.killpg(self.proc.pid, signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)

    def finish(self, timeout_s: float) -> int | None:
        """Wait up to `timeout_s` for the child to exit, then SIGKILL its process group;
        its exit status (None: never started)."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self._drain is not None:
            self._drain.join(5)
        self._close_log()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return self.proc.returncode

    def stop(self, timeout_s: float, ask: Callable[[], object] | None = None) -> int | None:
        """Ask the child to exit (`ask`, else `signal_stop`), then `finish(timeout_s)`."""
        if self.running:
            if ask is None:
                self.signal_stop()
            else:
                with contextlib.suppress(OSError):
                    ask()
        return self.finish(timeout_s)

    def _close_log(self) -> None:
        if self._log is not None and not self._log.closed:
            self._log.close()
