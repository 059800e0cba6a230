"""Tests that do not race the wall clock: poll a condition with `wait_until`, or drive time by
hand with `ManualClock` where the code under test takes a `clock`."""

from __future__ import annotations

import time
from collections.abc import Callable


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
