"""Starting and stopping a cluster for one A/B run: a `relaykv up --json <flags>` subprocess.

Contract (docs/benchmarking.md "What the servers must provide"):
the command prints exactly one JSON line
`{"router": URL, "prefill": [URL], "decode": [URL]}` once every engine is ready and runs
until SIGTERM/SIGINT. Other output lines are allowed (they go to the run's log). The child
gets its own session so that, if SIGTERM does not stop it within the timeout, its whole
process group can be killed without touching anything else.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

from relaykv.bench.engine_counters import ClusterUrls, parse_cluster
from relaykv.bench.server_info import ServerError


class ClusterStartError(RuntimeError):
    """The up command exited, timed out, or never printed its JSON line."""


def _cluster_line(line: str) -> ClusterUrls | None:
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        body = json.loads(text)
        return parse_cluster(body) if isinstance(body, dict) and "router" in body else None
    except (json.JSONDecodeError, ServerError):
        return None


class ClusterProcess:
    """`with ClusterProcess(argv, log_path) as cluster:` -> `cluster.urls`, stopped on exit."""

    def __init__(
        self,
        argv: list[str],
        log_path: Path,
        *,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        if not argv:
            raise ClusterStartError("empty cluster command")
        self.argv = argv
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.urls: ClusterUrls | None = None
        self._lines: queue.Queue[ClusterUrls | None] = queue.Queue()
        self._reader: threading.Thread | None = None
        self._log: IO[str] | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def start(self) -> ClusterUrls:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise ClusterStartError(f"cannot run `{self.command}`: {exc}") from exc
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            urls = self._lines.get(timeout=self.ready_timeout_s)
        except queue.Empty:
            self.stop()
            raise ClusterStartError(
                f"`{self.command}` printed no cluster JSON line within {self.ready_timeout_s:g}"
                f" s; log: {self.log_path}"
            ) from None
        if urls is None:
            status = self.proc.wait()
            self.stop()
            raise ClusterStartError(
                f"`{self.command}` exited with status {status} before printing its cluster "
                f"JSON line; last output:\n{self.log_tail()}"
            )
        self.urls = urls
        return urls

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None and self._log is not None
        found = False
        for line in self.proc.stdout:
            if not self._log.closed:  # stop() may give up waiting for a stuck pipe
                self._log.write(line)
                self._log.flush()
            if not found and (urls := _cluster_line(line)) is not None:
                found = True
                self._lines.put(urls)
        if not found:
            self._lines.put(None)

    def stop(self) -> int | None:
        """SIGTERM, wait; SIGKILL the process group if it outlives the timeout."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self._log is not None and not self._log.closed:
            self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> ClusterProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
