"""The event loop's ordering: by time, then by scheduling order; never backwards."""

from __future__ import annotations

import pytest

from relaykv.sim.clock import EventLoop


def test_events_run_in_time_then_fifo_order() -> None:
    loop = EventLoop()
    seen: list[tuple[float, str]] = []
    loop.at(2.0, lambda: seen.append((loop.now, "b")))
    loop.at(1.0, lambda: seen.append((loop.now, "a")))
    loop.at(2.0, lambda: seen.append((loop.now, "c")))

    def chain() -> None:
        seen.append((loop.now, "d"))
        loop.after(0.0, lambda: seen.append((loop.now, "e")))  # same time, after the rest

    loop.at(1.0, chain)
    loop.run()
    assert seen == [(1.0, "a"), (1.0, "d"), (1.0, "e"), (2.0, "b"), (2.0, "c")]
    assert loop.now == 2.0 and loop.pending == 0


def test_no_event_in_the_past_and_run_until() -> None:
    loop = EventLoop()
    hits: list[float] = []
    loop.at(1.0, lambda: hits.append(loop.now))
    loop.at(5.0, lambda: hits.append(loop.now))
    loop.run(until=2.0)
    assert hits == [1.0] and loop.pending == 1
    with pytest.raises(ValueError, match="past"):
        loop.at(0.5, lambda: None)
    loop.run()
    assert hits == [1.0, 5.0]
