"""A `relaykv up` cluster as the chaos tests (and benchmarks/chaos_acceptance.py) see it.

`UpCluster` starts `relaykv up --json` (so supervision and the ordered drain are the real
ones), knows each member's URL and pid, loads it with concurrent requests, and checks what
must hold after any fault: every engine's pool back to all-free with nothing running, and no
shared-memory file left by any member process that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SHM_DIR = "/dev/shm"
SHM_NAME = re.compile(r"relaykv-([0-9]+)-[0-9a-f]{32}")


@dataclass
class Outcome:
    status: int
    token_ids: list[int] | None
    error: str = ""
    seconds: float = 0.0


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry))
    return found


def _listening_pid(url: str, candidates: Sequence[int]) -> int | None:
    """Which of `candidates` serves `url` (its argv names the port)."""
    port = url.rsplit(":", 1)[1]
    for pid in candidates:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in argv and argv[argv.index(b"--port") + 1] == port.encode():
            return pid
    return None


@dataclass
class UpCluster:
    args: list[str]
    log_dir: Path
    proc: subprocess.Popen | None = None
    info: dict = field(default_factory=dict)
    member_pids: set[int] = field(default_factory=set)  # every member process ever seen

    def start(self, timeout: float = 240.0) -> UpCluster:
        with open(self.log_dir / "up.stderr", "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relaykv", "up", "--json", "--log-dir", str(self.log_dir),
                 "--startup-timeout", str(timeout), *self.args],
                stdout=subprocess.PIPE, stderr=stderr, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        line = self.proc.stdout.readline()  # the JSON line once every member is ready
        if not line:
            raise RuntimeError(f"relaykv up failed:\n{self.up_log()}")
        self.info = json.loads(line)
        self.pids()
        return self

    def up_log(self) -> str:
        return (self.log_dir / "up.stderr").read_text(errors="replace")[-4000:]

    @property
    def router(self) -> str:
        return self.info["router"]

    def engines(self) -> list[str]:
        return [*self.info["prefill"], *self.info["decode"]]

    def pids(self) -> dict[str, int]:
        """url -> pid of the member now serving it."""
        assert self.proc is not None
        children = _children(self.proc.pid)
        out = {}
        for url in (self.router, *self.engines()):
            pid = _listening_pid(url, children)
            if pid is not None:
                out[url] = pid
                self.member_pids.add(pid)
        return out

    def kill(self, url: str, sig: int = signal.SIGKILL) -> int:
        pid = self.pids()[url]
        os.kill(pid, sig)
        return pid

    def wait_healthy(self, url: str, timeout: float = 30.0, not_pid: int | None = None) -> float:
        """Seconds until `url` answers /health again (from a new process if `not_pid`)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            pid = self.pids().get(url)
            if pid is not None and pid != not_pid:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        return time.monotonic() - start
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"{url} not back within {timeout}s\n{self.up_log()}")

    def stop(self, timeout: float = 120.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    # -- what must hold after a fault ------------------------------------------------------
    def settled(self, timeout: float = 60.0) -> None:
        """Every engine: no request running or waiting, every KV block free (or cached)."""
        deadline = time.monotonic() + timeout
        last = {}
        while time.monotonic() < deadline:
            last = {url: engine_state(url) for url in self.engines()}
            if all(s["running"] == 0 and s["waiting"] == 0 and s["free"] == s["total"]
                   for s in last.values()):
                return
            time.sleep(0.2)
        raise AssertionError(f"engines did not settle (leaked blocks or requests): {last}")

    def leaked_shm(self) -> list[str]:
        """Shared-memory files created by a member process that no longer exists."""
        leaked = []
        for name in os.listdir(SHM_DIR):
            found = SHM_NAME.fullmatch(name)
            pid = int(found.group(1)) if found else -1
            if pid in self.member_pids and not Path(f"/proc/{pid}").exists():
                leaked.append(name)
        return leaked


def listeners(pids: Sequence[int]) -> tuple[list[int], list[str]]:
    """Every listening TCP port and every bound unix socket path of `pids` (root reads
    their file descriptors; /proc/net maps the socket inodes to ports and paths)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    paths = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith("/"):
            paths.add(fields[7])
    return sorted(ports), sorted(paths)


def descendants(pid: int) -> list[int]:
    """`pid`'s children, their children, ..."""
    out, todo = [], [pid]
    while todo:
        found = _children(todo.pop())
        out += found
        todo += found
    return out


def engine_state(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out = {"running": -1.0, "waiting": -1.0, "free": -1.0, "total": -2.0}
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            out["running"] = float(line.split()[-1])
        elif line.startswith("vllm:num_requests_waiting"):
            out["waiting"] = float(line.split()[-1])
        elif line.startswith("relaykv:kv_cache_blocks") and 'state="free"' in line:
            out["free"] = float(line.split()[-1])
        elif line.startswith("relaykv:kv_cache_blocks") and 'state="total"' in line:
            out["total"] = float(line.split()[-1])
    return out


async def _one(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int,
               stream: bool) -> Outcome:
    body = {"model": "tiny-hybrid", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True, "stream": stream}
    start = time.monotonic()
    try:
        if not stream:
            resp = await client.post(f"{url}/v1/completions", json=body)
            if resp.status_code != 200:
                return Outcome(resp.status_code, None, resp.text[:300],
                               time.monotonic() - start)
            ids = resp.json()["choices"][0].get("token_ids")
            return Outcome(200, ids, "", time.monotonic() - start)
        ids: list[int] = []
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return Outcome(resp.status_code, None, (await resp.aread()).decode()[:300])
            done = False
            async for line in resp.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return Outcome(502, None, event["error"]["message"])
                    ids += event["choices"][0].get("token_ids") or []
            assert done, "stream without [DONE]"
        return Outcome(200, ids, "", time.monotonic() - start)
    except httpx.HTTPError as exc:
        return Outcome(-1, None, f"{exc.__class__.__name__}: {exc}", time.monotonic() - start)


async def run_load(url: str, prompts: Sequence[list[int]], concurrency: int, max_tokens: int = 8,
                   stream: bool = False, timeout: float = 120.0,
                   headers: dict[str, str] | None = None) -> list[Outcome]:
    """Send every prompt through the router, `concurrency` at a time; outcomes in order."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        async def bounded(prompt: list[int]) -> Outcome:
            async with sem:
                return await _one(client, url, prompt, max_tokens, stream)

        return await asyncio.gather(*(bounded(p) for p in prompts))
