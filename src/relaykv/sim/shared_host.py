"""One host's CPUs shared by the engines' steps (docs/simulator.md "Calibration", step 4).

On an accelerator an engine's step runs on its own devices, and its time is the cost
model's. A CPU calibration describes one machine running the whole cluster: while P
prefills, D's decode steps share the cores (and memory bandwidth, caches, and the router's
and client's streaming) with it, and both run slower than alone. The calibration measures
by how much (`HardwareSpec.shared_host_slowdown`, from the engines' own step logs) and the
simulator applies it here, as processor sharing:

* a step carries `seconds` of work: its time alone (the cost model's);
* while it is the only step running on the host, it progresses at rate 1; while another
  engine's step runs too, at rate `1 / slowdown` (every running step is slowed alike);
* whenever a step starts or ends, the work each running step has left is brought up to the
  clock and its end is rescheduled at the new rate.

Contract: `run(seconds, done)` calls `done()` once, when the step's work is complete;
with one step at a time every step ends exactly `seconds` after it started. The slowdown
is one measured number (two engines overlapping); three or more running steps are slowed by
the same factor. A cluster on presets (`slowdown` 1) does not use this class at all, so its
event order is unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from relaykv.sim.clock import EventLoop


@dataclass(slots=True)
class _RunningStep:
    remaining: float  # seconds of work left, at rate 1
    done: Callable[[], None]
    version: int = 0  # bumped on every reschedule: an end event of an older version is void


class SharedHost:
    def __init__(self, loop: EventLoop, slowdown: float) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"a shared host's slowdown must be >= 1, got {slowdown}")
        self.loop = loop
        self.slowdown = slowdown
        self._running: dict[int, _RunningStep] = {}
        self._ids = itertools.count()
        self._since = loop.now  # when `remaining` was last brought up to the clock

    @property
    def running(self) -> int:
        return len(self._running)

    def run(self, seconds: float, done: Callable[[], None]) -> None:
        """Start a step of `seconds` alone; `done()` when its work is complete."""
        if seconds < 0:
            raise ValueError(f"a step's work must be >= 0 seconds, got {seconds}")
        self._advance()
        self._running[next(self._ids)] = _RunningStep(seconds, done)
        self._reschedule()

    def _rate(self) -> float:
        return 1.0 / self.slowdown if len(self._running) > 1 else 1.0

    def _advance(self) -> None:
        """Subtract the work done since `_since` at the rate that held meanwhile."""
        now = self.loop.now
        done = (now - self._since) * self._rate()
        for step in self._running.values():
            step.remaining = max(0.0, step.remaining - done)
        self._since = now

    def _reschedule(self) -> None:
        rate = self._rate()
        for key, step in self._running.items():
            step.version += 1
            self.loop.after(step.remaining / rate, partial(self._end, key, step.version))

    def _end(self, key: int, version: int) -> None:
        step = self._running.get(key)
        if step is None or step.version != version:
            return  # rescheduled since: a later event ends it
        self._advance()
        del self._running[key]
        self._reschedule()
        step.done()

    def check(self) -> list[str]:
        """Invariants: no running step has negative work left."""
        return [
            f"step {k}: {s.remaining} s left" for k, s in self._running.items() if s.remaining < 0
        ]
