"""The simulated link: latency, then processor sharing per engine NIC."""

from __future__ import annotations

import pytest

from relaykv.sim.clock import EventLoop
from relaykv.sim.hardware import LinkSpec
from relaykv.sim.transport import Flow, SimHandle, SimLink

SPEC = LinkSpec("test", bandwidth=100.0, latency_s=0.5)


def _flow(done: dict, name: str, src: str, dst: str, nbytes: int, loop: EventLoop) -> Flow:
    handle = SimHandle(name, name, None, nbytes)  # type: ignore[arg-type]
    return Flow(handle, src, dst, float(nbytes), on_done=lambda: done.__setitem__(name, loop.now))


def test_one_transfer_takes_latency_plus_bytes_over_bandwidth() -> None:
    loop, done = EventLoop(), {}
    link = SimLink(loop, SPEC)
    link.start(_flow(done, "a", "P0", "D0", 1000, loop))
    loop.run()
    assert done["a"] == pytest.approx(0.5 + 10.0)
    assert link.bytes_moved == 1000


def test_concurrent_transfers_share_the_nic() -> None:
    loop, done = EventLoop(), {}
    link = SimLink(loop, SPEC)
    link.start(_flow(done, "a", "P0", "D0", 1000, loop))
    link.start(_flow(done, "b", "P1", "D0", 1000, loop))  # same D NIC: half rate each
    link.start(_flow(done, "c", "P2", "D1", 1000, loop))  # its own path: full rate
    loop.run()
    assert done["a"] == pytest.approx(0.5 + 20.0)
    assert done["b"] == pytest.approx(0.5 + 20.0)
    assert done["c"] == pytest.approx(0.5 + 10.0)


def test_a_late_flow_slows_the_first_only_while_both_run() -> None:
    loop, done = EventLoop(), {}
    link = SimLink(loop, SPEC)
    link.start(_flow(done, "a", "P0", "D0", 1000, loop))
    loop.at(5.5, lambda: link.start(_flow(done, "b", "P0", "D1", 200, loop)))  # same P NIC
    loop.run()
    # a: 500 B alone by t=5.5, 50 B more during b's latency (t=6), then 50 B/s while b
    # moves its 200 B (t=6..10: a gets 200 B), then 250 B alone at 100 B/s.
    assert done["b"] == pytest.approx(10.0)
    assert done["a"] == pytest.approx(12.5)
