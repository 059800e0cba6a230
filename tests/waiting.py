"""Tests that do not race the wall clock: poll a condition with `wait_until`, or drive time by
hand with `ManualClock` where the code under test takes a `clock`."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx


def wait_until(
    condition: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.005,
    what: str = "the condition",
) -> None:
    """Poll `condition` until it is true; fail naming `what` after `timeout` seconds.

    The timeout only bounds a broken run: a passing test never depends on how fast the
    machine is."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_server_healthy(
    url: str,
    proc: subprocess.Popen,
    timeout: float,
    log_tail: Callable[[], str] = lambda: "",
) -> None:
    """Poll `url`/health until it answers 200; fail at once (with `log_tail()`) if the server
    process exits, and after `timeout` seconds otherwise."""

    def healthy() -> bool:
        assert proc.poll() is None, f"the server exited: {log_tail()}"
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout=timeout, interval=0.2, what=f"{url}/health")


class ManualClock:
    """A monotonic clock that moves only when the test says so (`clock()` reads it)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self.now += seconds
