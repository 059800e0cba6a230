"""`--kv-link-gbps`: the tcp transport paced like a link between two hosts.

Reference: a link of G Gbit/s cannot deliver N bytes in less than N * 8 / G seconds, so a
paced read of N bytes takes at least that long (a lower bound; nothing here asserts an
upper bound on timing), and the bytes land exactly as unpaced.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pytest

from relaykv.transfer.transport import (
    PageLayout,
    TransportOptions,
    add_transport_arguments,
    get_transport,
    options_from_args,
)
from relaykv.transfer.transport.layout import PageCopy
from relaykv.transfer.transport.planes.tcp import LinkPacer
from relaykv.transfer.transport.serving.standalone import seeded_buffer

LAYOUT = PageLayout(num_blocks=40, block_bytes=65536, page_bytes=(65536,))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pacer_books_the_link_back_to_back() -> None:
    clock = FakeClock()
    pacer = LinkPacer(8.0, clock)  # 1 GB/s
    assert pacer.reserve(1_000_000) == pytest.approx(100.001)
    assert pacer.reserve(2_000_000) == pytest.approx(100.003)  # queued behind the first
    clock.now = 200.0  # the link went idle: a new send starts now
    assert pacer.reserve(500_000) == pytest.approx(200.0005)
    with pytest.raises(ValueError, match="> 0"):
        LinkPacer(0.0)


def _read(gbps: float | None) -> tuple[float, np.ndarray, np.ndarray, list[PageCopy]]:
    options = TransportOptions(chunk_bytes=4 * 65536, window=2, link_gbps=gbps)
    transport = get_transport("tcp")
    src = seeded_buffer(LAYOUT, 7)
    dst = np.zeros_like(src)
    server = transport.create_server(src, LAYOUT, engine_id="P-link", options=options)
    client = transport.create_client(dst, LAYOUT, engine_id="D-link", options=options)
    try:
        pages = [
            PageCopy(0, s, d, 65536) for s, d in zip(range(1, 33), range(39, 7, -1), strict=True)
        ]
        server.allow("r", {0: list(range(1, 33))}, time.monotonic() + 30)
        started = time.monotonic()
        result = client.read(server.descriptor, "r", pages)
        elapsed = time.monotonic() - started
        assert result.nbytes == 32 * 65536
        server.check_invariants()
        client.check_invariants()
    finally:
        client.close()
        server.close()
    return elapsed, src, dst, pages


def test_a_paced_read_takes_the_link_time_and_lands_the_same_bytes() -> None:
    # 2 MiB over 0.1 Gbit/s: at least 0.168 s on the modelled link.
    elapsed, src, dst, pages = _read(0.1)
    assert elapsed >= 32 * 65536 * 8 / 0.1e9
    for p in pages:
        assert np.array_equal(dst[p.dst], src[p.src])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_transport_arguments(p)
    return p


def test_link_flag_round_trip_and_errors_name_the_flag() -> None:
    args = _parser().parse_args(["--kv-transport", "tcp", "--kv-link-gbps", "10"])
    assert options_from_args(args).link_gbps == 10.0
    assert options_from_args(_parser().parse_args([])).link_gbps is None
    for argv in (["--kv-transport", "tcp", "--kv-link-gbps", "0"], ["--kv-link-gbps", "10"]):
        with pytest.raises(ValueError, match="--kv-link-gbps"):
            options_from_args(_parser().parse_args(argv))
