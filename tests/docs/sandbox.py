"""A private machine for documented commands: their own network, /tmp and /dev/shm.

The docs name fixed ports (`relaykv serve --port 8000`, `--port 8100`) and fixed addresses
(10.0.0.1, 10.0.0.2); run as written on a shared machine they would meet another test's or
another user's. A `Sandbox` is a network, mount and PID namespace (`unshare --net --mount
--pid`, root only) with its own loopback, a private tmpfs on /run/netns (so the `ip netns` names a
doc creates are the sandbox's own), on /dev/shm and, unless the checkout lives there, on
/tmp. Every command runs in it through `nsenter`, optionally inside one of the `ip netns`
namespaces the doc created (its "hosts"). When the sandbox closes, its servers are stopped
(`stop`: SIGTERM to each process group, then SIGKILL: at once when the sandbox has its own
/tmp, else once the group has exited or after a timeout, so that a `relaykv up` removes its
runtime directory from the host's /tmp), then its PID namespace's init is killed, so the
kernel kills whatever is left (a supervisor's members included); the namespaces, veth pairs
and files vanish with their last process, also when a test fails half way.

Commands get the environment a user of the docs has after `source .venv/bin/activate`:
the venv's bin first on PATH, and none of the test session's `RELAYKV_*` variables (the
session's KV secret would hide a command that forgets its own).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import REPO

WORKDIR = "/tmp/doc-sandbox"  # the commands' working directory, inside the sandbox
_SETUP = """set -e
ip link set lo up
mkdir -p /run/netns && mount -t tmpfs tmpfs /run/netns
mount -t tmpfs tmpfs /dev/shm
{private_tmp}mkdir -p {workdir}
echo ready
exec sleep infinity
"""


def doc_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RELAYKV_") and k not in ("OPENAI_API_KEY", "PYTHONPATH")
    }
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}"
    env["VIRTUAL_ENV"] = str(Path(venv_bin).parent)
    return env


def _group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a process that has not exited (zombies do not count:
    the sandbox's init, `sleep`, never reaps the orphans it inherits)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def missing_tools() -> list[str]:
    return [t for t in ("unshare", "nsenter", "ip", "curl") if shutil.which(t) is None]


@dataclass
class Server:
    """A long-running documented command (an engine, a router, `relaykv up`)."""

    name: str
    command: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])


class Sandbox:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.env = doc_env()
        self.servers: list[Server] = []
        self._holder: subprocess.Popen[str] | None = None
        self._shares_tmp = False  # the host's /tmp (the checkout or venv lives there)

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        if missing := missing_tools():
            pytest.skip(f"the docs' commands need {', '.join(missing)} (apt-get install "
                        "util-linux iproute2 curl)")
        self.logs.mkdir(parents=True, exist_ok=True)
        self._shares_tmp = str(REPO).startswith("/tmp/") or sys.executable.startswith("/tmp/")
        setup = _SETUP.format(
            private_tmp="" if self._shares_tmp else "mount -t tmpfs tmpfs /tmp\n",
            workdir=WORKDIR,
        )
        self._holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc",
             "--propagation", "private", "--kill-child", "--", "sh", "-c", setup],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != "ready":
            err = self._holder.stderr.read() if self._holder.stderr else ""
            self._holder.kill()
            self._holder.wait()
            if os.geteuid() != 0:
                pytest.skip(f"the docs' network namespaces need root (unshare --net): {err}")
            raise RuntimeError(f"cannot set up the sandbox: {err}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for server in reversed(self.servers):
            self.stop(server)
        if self._holder is not None and self._holder.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._holder.pid, signal.SIGKILL)
            self._holder.wait()

    # -- running --------------------------------------------------------------------------

    def argv(self, command: str, host: str | None = None) -> list[str]:
        """`command` run by bash in the sandbox; in `ip netns` namespace `host` if given
        (the docs' "prefix each host's commands with `ip netns exec NAME`")."""
        assert self._holder is not None, "the sandbox is not open"
        pid = self._holder.pid
        argv = ["nsenter", "-t", str(pid), "--net", "--mount",
                f"--pid=/proc/{pid}/ns/pid_for_children", f"--wdns={WORKDIR}", "--"]
        if host is not None:
            argv += ["ip", "netns", "exec", host]
        return [*argv, "bash", "-c", command]

    def run(
        self, command: str, *, host: str | None = None, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(command, host), env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"`{command}` exited with status {done.returncode}\n"
                f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}\n{self.server_tails()}"
            )
        return done

    def start(self, command: str, name: str, *, host: str | None = None) -> Server:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                self.argv(command, host), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        server = Server(name, command, proc, log)
        self.servers.append(server)
        return server

    def stop(self, server: Server, timeout: float = 30) -> int:
        """SIGTERM to the server's process group, then SIGKILL; its exit status.

        The group's leader is `nsenter`, which dies of the SIGTERM at once. With its own /tmp
        the sandbox SIGKILLs the rest at once too (whatever they leave vanishes with the
        sandbox); sharing the host's, the command (`relaykv up` draining its cluster, say)
        gets up to `timeout` seconds to exit and clean up first."""
        if server.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + (timeout if self._shares_tmp else 0)
        while _group_alive(server.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):  # anything still in its group
            os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        if server in self.servers:
            self.servers.remove(server)
        return server.proc.returncode

    def wait_http(
        self, url: str, server: Server, *, host: str | None = None, timeout: float = 180
    ) -> None:
        """Poll `url` from inside the sandbox until it answers 2xx; fail at once with the
        server's log if it exits."""
        deadline = time.monotonic() + timeout
        probe = f"curl -sf -o /dev/null --max-time 2 {shlex.quote(url)}"
        while True:
            if server.proc.poll() is not None:
                raise AssertionError(
                    f"`{server.command}` exited with status {server.proc.returncode}:\n"
                    f"{server.tail()}"
                )
            if self.run(probe, host=host, check=False, timeout=10).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer within {timeout:g} s:\n{server.tail()}")
            time.sleep(0.3)

    def wait_log(self, server: Server, text: str, timeout: float = 180) -> str:
        """Wait until the server's output contains `text`; its output so far."""
        deadline = time.monotonic() + timeout
        while text not in (log := server.log_text()):
            if server.proc.poll() is not None:
                raise AssertionError(
                    f"`{server.command}` exited with status {server.proc.returncode}:\n{log}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} from `{server.command}` in {timeout:g} s")
            time.sleep(0.2)
        return log

    def server_tails(self) -> str:
        return "\n".join(f"--- {s.name} ---\n{s.tail(20)}" for s in self.servers)
