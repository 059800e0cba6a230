"""The discrete-event loop: a virtual clock and a queue of callbacks (docs/simulator.md).

Contract: `at(t, fn)` runs `fn()` when the clock reaches `t` (never earlier than `now`);
events at equal times run in the order they were scheduled (a sequence number breaks
ties), so a run is deterministic. `run()` pops events until none is left; the clock only
moves forward. Nothing sleeps: a step that "takes" 3 s just schedules its end 3 s later.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.num_events = 0

    def at(self, when: float, fn: Callable[[], None]) -> None:
        if when < self.now:
            raise ValueError(f"event at {when} is in the past (now {self.now})")
        heapq.heappush(self._queue, (when, next(self._seq), fn))

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.now + max(0.0, delay), fn)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def run(self, until: float = float("inf")) -> None:
        queue = self._queue
        while queue and queue[0][0] <= until:
            when, _, fn = heapq.heappop(queue)
            self.now = when
            self.num_events += 1
            fn()
