"""The shared transfer suite: every transport, in one process and across processes.

Reference: the expected bytes are the source buffer itself (numpy slices); a transport
passes only if each destination page equals its source page byte for byte and every
other destination byte is untouched.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from relaykv.transfer.transport import (
    FaultPlan,
    IntegrityError,
    LeaseExpired,
    PageCopy,
    ShortTransferError,
    TransferRefused,
    TransferTimeout,
)
from tests.waiting import wait_until

from .conftest import LAYOUT, Pair

_counter = iter(range(10**9))


def rid(tag: str) -> str:
    return f"{tag}-{next(_counter)}"


def random_read(
    rng: np.random.Generator, src_pool: list[int], dst_pool: list[int], per_group: int
) -> tuple[dict[int, list[int]], list[PageCopy]]:
    """Allowed blocks per group and pages mapping them to random destination blocks."""
    src = rng.choice(src_pool, size=per_group * LAYOUT.num_groups, replace=False)
    dst = rng.choice(dst_pool, size=per_group * LAYOUT.num_groups, replace=False)
    blocks: dict[int, list[int]] = {}
    pages = []
    for i, (s, d) in enumerate(zip(src, dst, strict=True)):
        group = i % LAYOUT.num_groups
        blocks.setdefault(group, []).append(int(s))
        pages.append(PageCopy(group, int(s), int(d), LAYOUT.page_bytes[group]))
    return blocks, pages


def assert_landed(pair: Pair, pages: list[PageCopy]) -> None:
    expected = np.zeros_like(pair.dst)
    for p in pages:
        expected[p.dst, : p.nbytes] = pair.source.src[p.src, : p.nbytes]
    assert np.array_equal(pair.dst, expected), "destination differs from the reference"


def assert_untouched(pair: Pair, fill: int) -> None:
    assert (pair.dst == fill).all(), "a refused read must not write any byte"


def test_random_pages_several_groups(pair: Pair) -> None:
    rng = np.random.default_rng(1)
    blocks, pages = random_read(rng, list(range(1, 64)), list(range(1, 64)), per_group=6)
    request = rid("rand")
    pair.source.allow(request, blocks)
    result = pair.client.read(pair.source.descriptor, request, pages)
    assert result.num_pages == len(pages)
    assert result.nbytes == sum(p.nbytes for p in pages)
    assert_landed(pair, pages)


def test_subset_of_allowed_blocks_and_two_reads(pair: Pair) -> None:
    request = rid("subset")
    pair.source.allow(request, {0: [3, 4, 5], 2: [7, 8]})
    first = [PageCopy(0, 4, 40, 8192), PageCopy(2, 8, 41, 1000)]
    second = [PageCopy(0, 3, 42, 8192)]
    pair.client.read(pair.source.descriptor, request, first)
    pair.client.read(pair.source.descriptor, request, second)
    assert_landed(pair, first + second)


def test_concurrent_reads_non_blocking(pair: Pair) -> None:
    rng = np.random.default_rng(2)
    dst_pool = list(rng.permutation(np.arange(1, 64)))
    handles, all_pages = [], []
    for k in range(6):
        blocks, pages = random_read(rng, list(range(1, 64)), dst_pool[k * 9 : (k + 1) * 9], 3)
        request = rid("conc")
        pair.source.allow(request, blocks)
        handles.append(pair.client.start_read(pair.source.descriptor, request, pages))
        all_pages += pages
    # the step-loop style: poll, never block
    wait_until(lambda: all(h.done() for h in handles), interval=0.002, what="the reads")
    assert [h.status for h in handles] == ["done"] * 6
    finished = {h.transfer_id for h in pair.client.completed()}
    assert {h.transfer_id for h in handles} <= finished
    assert_landed(pair, all_pages)


def test_read_ok_event_reaches_server(pair: Pair) -> None:
    request = rid("event")
    pair.source.allow(request, {1: [9, 10]})
    pages = [PageCopy(1, 9, 20, 3072), PageCopy(1, 10, 21, 3072)]
    pair.client.read(pair.source.descriptor, request, pages)
    ok: list[dict] = []

    def read_ok() -> bool:
        events = pair.source.events()
        ok.extend(e for e in events if e["kind"] == "read_ok" and e["request_id"] == request)
        return bool(ok)

    wait_until(read_ok, what="the read_ok event")
    assert ok[0]["nbytes"] == 2 * 3072


@pytest.mark.parametrize("case", ["unknown", "other_block", "other_group", "released", "expired"])
def test_refusals_copy_nothing(pair: Pair, case: str) -> None:
    pair.dst[:] = 0xAB
    request = rid("sec")
    pair.source.allow(request, {0: [11, 12], 1: [13]}, lease_s=0.2 if case == "expired" else 30)
    pages = [PageCopy(0, 11, 30, 8192), PageCopy(1, 13, 31, 3072)]
    asked = "no-such-request" if case == "unknown" else request
    if case == "other_block":
        pages.append(PageCopy(0, 14, 32, 8192))  # one bad page spoils the whole read
    if case == "other_group":
        pages.append(PageCopy(2, 12, 33, 1000))  # an allowed block, but of group 0
    if case == "released":
        pair.source.release(request)
    if case == "expired":
        time.sleep(0.3)
    expected = LeaseExpired if case == "expired" else TransferRefused
    with pytest.raises(expected):
        pair.client.read(pair.source.descriptor, asked, pages, timeout_s=5)
    assert_untouched(pair, 0xAB)


def test_corruption_is_detected_and_server_keeps_serving(pair: Pair) -> None:
    request = rid("corrupt")
    pair.source.allow(request, {0: [15, 16, 17]})
    pair.source.inject(FaultPlan(corrupt_page=1, request_ids=frozenset({request})))
    pages = [PageCopy(0, b, b + 30, 8192) for b in (15, 16, 17)]
    with pytest.raises(IntegrityError, match="page 1") as info:
        pair.client.read(pair.source.descriptor, request, pages)
    # with a push transport P may still be writing when D gives up on its own
    assert info.value.dst_quiesced is not pair.push
    healthy = rid("after-corrupt")
    pair.source.allow(healthy, {0: [18]})
    pair.dst[:] = 0
    ok = [PageCopy(0, 18, 50, 8192)]
    pair.client.read(pair.source.descriptor, healthy, ok)
    if pair.push:
        # the abandoned read's own rows may still take a late write from P (it was not
        # quiesced, asserted above); every other row must be exactly as the healthy read left it
        abandoned = [p.dst for p in pages]
        pair.dst[abandoned] = 0
    assert_landed(pair, ok)


def test_short_transfer_is_detected(pair: Pair) -> None:
    request = rid("short")
    pair.source.allow(request, {2: [19, 20, 21]})
    pair.source.inject(FaultPlan(short=True))
    pages = [PageCopy(2, b, b + 20, 1000) for b in (19, 20, 21)]
    with pytest.raises(ShortTransferError) as info:
        pair.client.read(pair.source.descriptor, request, pages)
    assert info.value.dst_quiesced  # P said Done: it writes nothing more


def test_dropped_read_times_out_on_time(pair: Pair) -> None:
    request = rid("drop")
    pair.source.allow(request, {0: [22]})
    pair.source.inject(FaultPlan(drop=True))
    start = time.monotonic()
    with pytest.raises(TransferTimeout):
        pair.client.read(
            pair.source.descriptor, request, [PageCopy(0, 22, 40, 8192)], timeout_s=0.5
        )
    assert time.monotonic() - start < 2.0


def test_server_dying_mid_transfer_fails_within_timeout(pair: Pair) -> None:
    request = rid("die")
    pair.source.allow(request, {0: [23, 24, 25, 26, 27]})
    pair.source.inject(FaultPlan(die_after_pages=2))
    pages = [PageCopy(0, b, b + 30, 8192) for b in (23, 24, 25, 26, 27)]
    start = time.monotonic()
    with pytest.raises(TransferTimeout, match="/5 pages"):
        pair.client.read(pair.source.descriptor, request, pages, timeout_s=0.7)
    assert time.monotonic() - start < 2.5


def test_delay_does_not_block_other_requests(pair: Pair) -> None:
    slow, fast = rid("slow"), rid("fast")
    pair.source.allow(slow, {0: [28]})
    pair.source.allow(fast, {0: [31]})
    # The slow read is held 3 s; the fast one, asked after it, must finish while the slow one
    # is still held (an ordering: one small read takes milliseconds, and the hold is all the
    # slow read's wall time, once per transport in CI). A 1 s hold was too short for a
    # subprocess source on a loaded 2-core CI host: the fast read once took longer.
    pair.source.inject(FaultPlan(delay_s=3.0, request_ids=frozenset({slow})))
    slow_h = pair.client.start_read(pair.source.descriptor, slow, [PageCopy(0, 28, 48, 8192)])
    pair.client.read(pair.source.descriptor, fast, [PageCopy(0, 31, 60, 8192)])
    assert not slow_h.done(), "the fast read waited for the delayed one"
    slow_h.result(timeout=10)
    assert_landed(pair, [PageCopy(0, 28, 48, 8192), PageCopy(0, 31, 60, 8192)])
