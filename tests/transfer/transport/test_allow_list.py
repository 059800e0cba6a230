"""The allow-list (`serving/allow_list.py`): validation, refusals, leases, and release waiting."""

from __future__ import annotations

import threading
import time

import pytest

from relaykv.transfer.transport import LeaseExpired, PageCopy, PageLayout, TransferRefused
from relaykv.transfer.transport.serving.allow_list import GrantTable
from tests.waiting import ManualClock, wait_until

LAYOUT = PageLayout(16, 1024, (1024, 512))


def table() -> tuple[GrantTable, ManualClock]:
    clock = ManualClock(100.0)
    return GrantTable(LAYOUT, clock=clock), clock


@pytest.mark.parametrize(
    "blocks, match",
    [
        ({2: [1]}, "group 2 out of range"),
        ({0: [0]}, "out of range"),  # the null block is never served
        ({0: [16]}, "out of range"),
        ({-1: [1]}, "group -1"),
    ],
)
def test_allow_rejects_bad_input_and_changes_nothing(blocks: dict, match: str) -> None:
    grants, _ = table()
    with pytest.raises(ValueError, match=match):
        grants.allow("r", blocks, 200.0)
    assert len(grants) == 0


def test_allow_twice_is_an_error() -> None:
    grants, _ = table()
    grants.allow("r", {0: [1]}, 200.0)
    with pytest.raises(ValueError, match="already allowed"):
        grants.allow("r", {0: [2]}, 200.0)


def test_check_read_accepts_exactly_the_allowed_pages() -> None:
    grants, _ = table()
    grants.allow("r", {0: [1, 2], 1: [3]}, 200.0)
    grants.check_read("r", [PageCopy(0, 2, 9, 1024), PageCopy(1, 3, 10, 512)])
    for bad, match in [
        (PageCopy(0, 3, 9, 1024), "block 3 of group 0"),
        (PageCopy(1, 1, 9, 512), "block 1 of group 1"),
        (PageCopy(0, 1, 9, 512), "geometry mismatch"),
    ]:
        with pytest.raises(TransferRefused, match=match):
            grants.check_read("r", [PageCopy(0, 1, 8, 1024), bad])
    with pytest.raises(TransferRefused, match="unknown"):
        grants.check_read("other", [PageCopy(0, 1, 8, 1024)])
    grants.check_invariants()


def test_lease_expiry_extend_and_sweep() -> None:
    grants, clock = table()
    grants.allow("r", {0: [1]}, 110.0)
    clock.now = 109.0
    grants.extend("r", 120.0)
    clock.now = 115.0
    grant = grants.check_read("r", [PageCopy(0, 1, 5, 1024)])
    clock.now = 121.0
    with pytest.raises(LeaseExpired):
        grants.check_read("r", [PageCopy(0, 1, 5, 1024)])
    with pytest.raises(LeaseExpired):
        grants.begin(grant)  # a transfer in flight stops at its next chunk
    assert grants.sweep_expired() == ["r"]
    with pytest.raises(LeaseExpired):  # still told apart from an unknown request
        grants.check_read("r", [PageCopy(0, 1, 5, 1024)])
    with pytest.raises(KeyError):
        grants.extend("r", 200.0)


def test_release_waits_for_copies_in_progress() -> None:
    grants = GrantTable(LAYOUT)
    grants.allow("r", {0: [1]}, time.monotonic() + 30)
    grant = grants.check_read("r", [PageCopy(0, 1, 5, 1024)])
    grants.begin(grant)
    released = threading.Event()
    worker = threading.Thread(target=lambda: (grants.release("r"), released.set()))
    worker.start()
    # Once the grant is revoked, release() is inside its wait: with the copy still running
    # it cannot have returned (no sleep that could pass before release even started).
    wait_until(lambda: grant.revoked, what="release() to revoke the grant")
    assert not released.is_set(), "release returned while a copy was running"
    with pytest.raises(TransferRefused, match="released"):
        grants.begin(grant)  # no new copy may start
    grants.end(grant)
    worker.join(timeout=5)
    assert released.is_set()
    assert grants.release("r") is True  # idempotent
    assert grants.release("r", wait_s=0) is True


def test_release_gives_up_after_wait() -> None:
    grants = GrantTable(LAYOUT)
    grants.allow("r", {0: [1]}, time.monotonic() + 30)
    grant = grants.check_read("r", [PageCopy(0, 1, 5, 1024)])
    grants.begin(grant)
    assert grants.release("r", wait_s=0.05) is False


def test_a_grant_is_read_by_one_engine_only() -> None:
    grants, _ = table()
    page = [PageCopy(0, 3, 5, 1024)]
    grants.allow("r", {0: [3]}, 200.0)
    grants.check_read("r", page, "D1")  # the first reader binds the grant
    grants.check_read("r", page, "D1")
    with pytest.raises(TransferRefused, match="granted to engine 'D1'"):
        grants.check_read("r", page, "D2")
    grants.allow("named", {0: [3]}, 200.0, reader="D2")  # the request named its destination
    with pytest.raises(TransferRefused, match="granted to engine 'D2'"):
        grants.check_read("named", page, "D1")
    grants.check_read("named", page, "D2")
    grants.check_invariants()
