"""The shared host: processor sharing at a measured slowdown, against hand-computed ends."""

from __future__ import annotations

import pytest

from relaykv.sim.clock import EventLoop
from relaykv.sim.shared_host import SharedHost


def _ends(slowdown: float, steps: list[tuple[float, float]]) -> list[float]:
    """Run steps given as (start time, seconds alone) and return when each ended."""
    loop = EventLoop()
    host = SharedHost(loop, slowdown)
    ends = [float("nan")] * len(steps)

    def start(i: int, seconds: float) -> None:
        host.run(seconds, lambda: ends.__setitem__(i, loop.now))

    for i, (at, seconds) in enumerate(steps):
        loop.at(at, lambda i=i, seconds=seconds: start(i, seconds))
    loop.run()
    assert host.running == 0 and host.check() == []
    return ends


def test_a_step_alone_takes_its_time() -> None:
    assert _ends(1.5, [(0.0, 2.0), (5.0, 1.0)]) == pytest.approx([2.0, 6.0])


def test_overlapping_steps_share_the_host() -> None:
    # Both run from 0 at rate 1/2: A's 1 s of work ends at 2; B then has 2 s left alone: 4.
    assert _ends(2.0, [(0.0, 1.0), (0.0, 3.0)]) == pytest.approx([2.0, 4.0])
    # B joins at 1 (A has 1 s left): both at rate 1/2 until A ends at 3, B (1 s done of 2)
    # has 1 s left alone: 4.
    assert _ends(2.0, [(0.0, 2.0), (1.0, 2.0)]) == pytest.approx([3.0, 4.0])


def test_slowdown_one_is_the_plain_clock() -> None:
    assert _ends(1.0, [(0.0, 1.0), (0.5, 1.0), (0.7, 0.1)]) == pytest.approx([1.0, 1.5, 0.8])


def test_three_steps_are_slowed_by_the_same_factor() -> None:
    # A, B, C from 0 at rate 1/1.5: C (0.3 s) ends at 0.45; A and B (0.3 done each) go on
    # at 1/1.5: A (0.7 left) ends at 1.5; B has 1.2 - 0.3 - 0.7 = 0.2 left, alone: 1.7.
    ends = _ends(1.5, [(0.0, 1.0), (0.0, 1.2), (0.0, 0.3)])
    assert ends == pytest.approx([1.5, 1.7, 0.45])


def test_bad_input_is_refused() -> None:
    loop = EventLoop()
    with pytest.raises(ValueError, match="slowdown"):
        SharedHost(loop, 0.9)
    host = SharedHost(loop, 1.2)
    with pytest.raises(ValueError, match="work"):
        host.run(-1.0, lambda: None)
    assert host.running == 0
