"""Starting and stopping a cluster for one A/B run: a `relaykv up --json <flags>` subprocess.

Contract (docs/benchmarking.md "What the servers must provide"):
the command prints exactly one JSON line
`{"router": URL, "prefill": [URL], "decode": [URL]}` once every engine is ready and runs
until SIGTERM/SIGINT. Other output lines are allowed (they go to the run's log). The child
gets its own session so that, if SIGTERM does not stop it within the timeout, its whole
process group can be killed without touching anything else.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from relaykv.bench.engine_counters import ClusterUrls, parse_cluster
from relaykv.bench.server_info import ServerError
from relaykv.common.plumbing.child_process import ChildProcess


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
        # SIGTERM to the up command alone: it stops its own cluster.
        self.child = ChildProcess(argv, log_path=log_path, pipe=True, signal_group=False)
        self.urls: ClusterUrls | None = None

    @property
    def proc(self) -> subprocess.Popen[str] | None:
        return self.child.proc

    @property
    def command(self) -> str:
        return self.child.command

    def start(self) -> ClusterUrls:
        try:
            self.child.start()
        except OSError as exc:
            raise ClusterStartError(f"cannot run `{self.command}`: {exc}") from exc
        try:
            urls = self.child.wait_for_line(_cluster_line, self.ready_timeout_s)
        except TimeoutError:
            self.stop()
            raise ClusterStartError(
                f"`{self.command}` printed no cluster JSON line within {self.ready_timeout_s:g}"
                f" s; log: {self.log_path}"
            ) from None
        if urls is None:
            status = self.child.finish(self.stop_timeout_s)
            raise ClusterStartError(
                f"`{self.command}` exited with status {status} before printing its cluster "
                f"JSON line; last output:\n{self.log_tail()}"
            )
        self.urls = urls
        return urls

    def stop(self) -> int | None:
        """SIGTERM, wait; SIGKILL the process group if it outlives the timeout."""
        return self.child.stop(self.stop_timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        return self.child.log_tail(lines)

    def __enter__(self) -> ClusterProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
