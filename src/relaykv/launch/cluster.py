"""Start and stop a local P/D cluster: prefill engines, decode engines and a router.

Every member is its own `relaykv` process (the same commands a two-host deployment runs), on
free loopback ports unless told otherwise, with its output in a log file. `Cluster.start`
returns once every member answers `/health`; a member that exits during startup stops the
whole cluster with the tail of its log. `Cluster.launch(member)` (re)starts one member on its
own port (supervisor.py restarts dead ones). `Cluster.stop` drains in order (docs/pd.md,
"Stopping"): SIGTERM to the router, which stops taking requests and lets those in flight
finish; once it has exited, the prefill engines; then the decode engines; SIGKILL only for a
member that outlives its timeout. Secrets reach members through `env`, never their argv.

With a shared KV tier (`relaykv up --kv-offloading-backend mooncake`), a Mooncake Store
master is the first member (`kvstore`): it starts, and answers `/health` on its loopback admin
port, before any engine, is restarted like the others when it dies, and stops last, after the
engines have closed their store clients (docs/tier.md, "Mooncake Store").

With KV events on (cache-aware routing), each engine publishes them and serves their replay
on `ipc://` sockets in the cluster's runtime directory (`run_dir`, mode 0700: the kernel
lets no other uid reach them; docs/security.md, "Listeners"), never on a TCP port. `relaykv
up` brings its own (run_dir.py); a cluster given none makes one and removes it in `stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from relaykv.common.plumbing.child_process import ChildProcess, free_port
from relaykv.launch.run_dir import RunDir

_MAX_IPC_PATH = 100  # sun_path holds 107 bytes and a NUL
STORE = "kvstore"  # the member name of a shared KV tier's master


@dataclass(slots=True)
class Member:
    name: str
    url: str
    argv: list[str]
    log_path: Path
    child: ChildProcess | None = None
    restarts: int = 0

    @property
    def role(self) -> str:
        return self.name.rstrip("0123456789")

    @property
    def process(self) -> subprocess.Popen[str] | None:
        return None if self.child is None else self.child.proc

    def log_tail(self, lines: int = 20) -> str:
        return "(no log)" if self.child is None else self.child.log_tail(lines)


class ClusterError(RuntimeError):
    """A member could not start; the message says which and why."""


@dataclass
class Cluster:
    engine_args: list[str]
    prefill_args: list[str] = field(default_factory=list)
    decode_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    num_prefill: int = 1
    num_decode: int = 1
    host: str = "127.0.0.1"
    router_port: int | None = None
    log_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment (secrets)
    kv_events: bool = False  # engines publish KV events (docs/kv-events.md) for the router
    run_dir: Path | None = None  # private (0700) directory of the event sockets
    store: tuple[list[str], str] | None = None  # a KV store master: its argv, its health URL
    members: list[Member] = field(default_factory=list)
    _own_run_dir: RunDir | None = None

    @property
    def router(self) -> Member:
        return self.members[-1]

    def urls(self, role: str) -> list[str]:
        return [m.url for m in self.members if m.name.startswith(role)]

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "relaykv"]

    def plan(self) -> None:
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="relaykv-up-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        if self.kv_events and self.run_dir is None:
            self._own_run_dir = RunDir.create()
            self.run_dir = self._own_run_dir.path
        try:
            self._plan_members(log_dir)
        except BaseException:
            self._remove_own_run_dir()
            raise

    def _plan_members(self, log_dir: Path) -> None:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.store is not None:
            argv, url = self.store
            self.members.append(Member(STORE, url, argv, log_dir / f"{STORE}.log"))
        for role, count, extra in (
            ("prefill", self.num_prefill, self.prefill_args),
            ("decode", self.num_decode, self.decode_args),
        ):
            for i in range(count):
                port = free_port(self.host)
                argv = [*self._command(), "serve", "--role", role, "--host", self.host,
                        "--port", str(port), *self.engine_args, *extra,
                        *self._events_args(f"{role}{i}")]
                self.members.append(Member(f"{role}{i}", f"http://{host}:{port}", argv,
                                           log_dir / f"{role}{i}.log"))
        port = self.router_port or free_port(self.host)
        argv = [*self._command(), "router", "--host", self.host, "--port", str(port),
                "--prefill", ",".join(self.urls("prefill")),
                "--decode", ",".join(self.urls("decode")), *self.router_args]
        self.members.append(Member("router", f"http://{host}:{port}", argv, log_dir / "router.log"))

    def _events_args(self, name: str) -> list[str]:
        """Events and replay on ipc sockets in the private runtime directory: the router is
        on this host, and no other uid can enter the directory (a restarted engine binds
        the same paths again)."""
        if not self.kv_events:
            return []
        assert self.run_dir is not None
        sockets = [self.run_dir / f"{name}-{kind}" for kind in ("events", "replay")]
        if any(len(str(path)) > _MAX_IPC_PATH for path in sockets):
            raise ClusterError(
                f"the runtime directory {self.run_dir} is too long a path for a unix socket "
                f"(at most {_MAX_IPC_PATH} characters); set TMPDIR to a shorter directory"
            )
        config = {
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"ipc://{sockets[0]}", "replay_endpoint": f"ipc://{sockets[1]}",
        }
        return ["--kv-events-config", json.dumps(config)]

    def start(
        self,
        timeout: float = 900.0,
        progress: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """Launch every member and wait until each answers `/health`. ClusterError (after
        stopping what runs) if one exits, the timeout passes or `cancelled()` turns true."""
        if not self.members:
            self.plan()
        deadline = time.monotonic() + timeout
        first = [m for m in self.members if m.role == STORE]  # engines connect to it
        for group in (first, [m for m in self.members if m not in first]):
            self._check_cancelled(cancelled)
            for member in group:
                self.launch(member)
            self._await(group, deadline, timeout, progress, cancelled)

    def _check_cancelled(self, cancelled: Callable[[], bool] | None) -> None:
        if cancelled is not None and cancelled():
            self.stop()
            raise ClusterError("asked to stop before every member was ready")

    def _await(
        self,
        pending: list[Member],
        deadline: float,
        timeout: float,
        progress: Callable[[str], None] | None,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        """Wait until every member of `pending` answers `/health` (stop all if one dies)."""
        pending = list(pending)
        with httpx.Client(timeout=2.0) as client:
            while pending:
                self._check_cancelled(cancelled)
                for member in list(pending):
                    assert member.process is not None
                    code = member.process.poll()
                    if code is not None:
                        self.stop()
                        raise ClusterError(
                            f"{member.name} exited with status {code} during startup "
                            f"(log {member.log_path}):\n{member.log_tail()}"
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{member.url}/health").status_code == 200:
                            pending.remove(member)
                            if progress:
                                progress(f"{member.name} ready at {member.url}")
                if time.monotonic() > deadline:
                    names = ", ".join(m.name for m in pending)
                    self.stop()
                    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {names}")
                if pending:
                    time.sleep(0.2)

    def launch(self, member: Member) -> None:
        """Start `member` (again), appending to its log."""
        # The parent-death signal follows the launching *thread*: `relaykv up` launches and
        # restarts members from its main thread only (docs/security.md, "Faults and what
        # they cost": a `relaykv up` killed by SIGKILL leaves no orphaned engines).
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        member.child = ChildProcess(
            member.argv, log_path=member.log_path, env=env, die_with_parent=True
        )
        member.child.start()

    def stop(self, timeout: float = 30.0, router_timeout: float = 90.0) -> dict[str, int]:
        """Drain in order: the router (it finishes what is in flight, up to its
        --drain-timeout), then prefill, then decode engines; returns each exit status."""
        codes: dict[str, int] = {}
        for role, wait_s in (("router", router_timeout), ("prefill", timeout),
                             ("decode", timeout), (STORE, timeout)):
            group = [m.child for m in self.members if m.role == role and m.child is not None]
            for child in group:
                child.signal_stop()
            deadline = time.monotonic() + wait_s
            for member in self.members:
                if member.role == role and member.child is not None:
                    code = member.child.finish(max(0.1, deadline - time.monotonic()))
                    assert code is not None
                    codes[member.name] = code
        self._remove_own_run_dir()
        return codes

    def _remove_own_run_dir(self) -> None:
        if self._own_run_dir is not None:
            self._own_run_dir.remove()

    def describe(self) -> dict[str, object]:
        return {
            "router": self.router.url,
            "prefill": self.urls("prefill"),
            "decode": self.urls("decode"),
        }
