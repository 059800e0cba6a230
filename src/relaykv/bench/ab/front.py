"""A production router in front of one A/B run's engines (`relaykv bench ab --front-cmd`).

The cluster command (`relaykv up --json`) names its engines; the front-end command template
is then filled with them and started, and the run's requests go to it instead of relaykv's
router, while the engines' counters are read exactly as before (from the engine URLs, not
through the front end, which has no `/cluster`). Placeholders, after shell-style splitting:

* `{port}`: a free loopback port the front end must listen on (required);
* `{prefill}`, `{decode}` as a whole argument: the flag before it is repeated once per
  engine (`--prefill {prefill}` -> `--prefill URL1 --prefill URL2`, vllm-router's form);
  inside a longer argument they are the comma-joined URLs (`--decode={decode}`).

The front end is ready when `GET /v1/models` through it answers 200. It gets its own
session, and `stop` sends SIGTERM, then SIGKILL to its process group after the timeout.
"""

from __future__ import annotations

import shlex
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from relaykv.bench.ab.cluster import ClusterStartError
from relaykv.bench.engine_counters import ClusterUrls
from relaykv.common.plumbing.child_process import ChildProcess, free_port

PLACEHOLDERS = ("{port}", "{prefill}", "{decode}")


def check_template(template: str) -> list[str]:
    """The split template; ValueError naming --front-cmd if it cannot work."""
    try:
        tokens = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"--front-cmd: {exc}") from None
    if not tokens:
        raise ValueError("--front-cmd is empty")
    if not any("{port}" in t for t in tokens):
        raise ValueError("--front-cmd must contain {port} (the port the front end listens on)")
    for i, token in enumerate(tokens):
        if token in ("{prefill}", "{decode}") and (i == 0 or not tokens[i - 1].startswith("-")):
            raise ValueError(f"--front-cmd: {token} as an argument must follow a flag")
    return tokens


def front_argv(template: str, urls: ClusterUrls, port: int) -> list[str]:
    tokens = check_template(template)
    lists = {"{prefill}": list(urls.prefill), "{decode}": list(urls.decode)}
    argv: list[str] = []
    for token in tokens:
        if token in lists:
            flag = argv.pop()
            for url in lists[token]:
                argv += [flag, url]
            continue
        for name, values in lists.items():
            token = token.replace(name, ",".join(values))
        argv.append(token.replace("{port}", str(port)))
    return argv


class FrontProcess:
    """`start()` -> the front end's URL; `stop()` -> its exit status."""

    def __init__(
        self,
        template: str,
        urls: ClusterUrls,
        log_path: Path,
        *,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.port = free_port()
        self.argv = front_argv(template, urls, self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.child = ChildProcess(self.argv, log_path=log_path)

    @property
    def proc(self) -> subprocess.Popen[str] | None:
        return self.child.proc

    @property
    def command(self) -> str:
        return self.child.command

    def start(self) -> str:
        try:
            self.child.start()
        except OSError as exc:
            raise ClusterStartError(f"cannot run front end `{self.command}`: {exc}") from exc
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if (status := self.child.poll()) is not None:
                self.stop()
                raise ClusterStartError(
                    f"front end `{self.command}` exited with status {status}; "
                    f"log: {self.log_path}"
                )
            if self._ready():
                return self.url
            time.sleep(0.2)
        self.stop()
        raise ClusterStartError(
            f"front end `{self.command}` did not answer /v1/models within "
            f"{self.ready_timeout_s:g} s; log: {self.log_path}"
        )

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> int | None:
        return self.child.stop(self.stop_timeout_s)
