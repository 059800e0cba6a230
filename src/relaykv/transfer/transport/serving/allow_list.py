"""The serving side's allow-list: which blocks of which requests a reader may have.

Security rule (P/D issue): a transfer endpoint only serves blocks of requests it was
told about. P's engine calls `allow(request_id, {group: [block ids]}, lease_deadline)`
when a prefill finishes and `release(request_id)` when D is done (or the engine gives
up). A read naming an unknown request, a block outside the allowed set, a released or
expired request, or a wrong page size is refused before any byte is copied.

`release` returns only once no copy of that request's pages is in progress, so the
engine may free and reuse the blocks right after it returns.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from relaykv.transfer.transport.errors import LeaseExpired, TransferRefused
from relaykv.transfer.transport.layout import NULL_BLOCK, PageCopy, PageLayout

REMEMBER_EXPIRED = 4096


@dataclass(slots=True)
class Grant:
    request_id: str
    blocks: dict[int, frozenset[int]]
    deadline: float
    reader: str | None = None  # the one engine that may read it (bound at first read)
    inflight: int = 0
    revoked: bool = False
    expired: bool = False


@dataclass(slots=True)
class GrantTable:
    """Thread-safe table of grants. Times are `clock()` seconds (time.monotonic)."""

    layout: PageLayout
    clock: Callable[[], float] = time.monotonic
    _grants: dict[str, Grant] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    # recently expired ids, so a late reader hears "lease expired", not "unknown"
    _expired: OrderedDict[str, None] = field(default_factory=OrderedDict)

    # -- engine side ----------------------------------------------------------------
    def allow(
        self,
        request_id: str,
        blocks: Mapping[int, Iterable[int]],
        lease_deadline: float,
        reader: str | None = None,
    ) -> None:
        """Let a reader have `blocks` of `request_id` until `lease_deadline` (clock time):
        `reader` if given, else whichever engine reads first (the grant is bound to it)."""
        checked: dict[int, frozenset[int]] = {}
        for group, ids in blocks.items():
            if not 0 <= group < self.layout.num_groups:
                raise ValueError(f"allow {request_id!r}: group {group} out of range")
            id_set = frozenset(int(b) for b in ids)
            bad = [b for b in id_set if not NULL_BLOCK < b < self.layout.num_blocks]
            if bad:
                raise ValueError(
                    f"allow {request_id!r}: group {group} block(s) {sorted(bad)[:5]} out of "
                    f"range 1..{self.layout.num_blocks - 1}"
                )
            checked[int(group)] = id_set
        with self._cond:
            if request_id in self._grants:
                raise ValueError(f"request {request_id!r} is already allowed; release it first")
            self._grants[request_id] = Grant(request_id, checked, float(lease_deadline), reader)
            self._expired.pop(request_id, None)

    def extend(self, request_id: str, lease_deadline: float) -> None:
        """Move a live grant's deadline (a lease renewal)."""
        with self._cond:
            grant = self._grants.get(request_id)
            if grant is None:
                raise KeyError(f"request {request_id!r} is not allowed (released or expired)")
            grant.deadline = float(lease_deadline)

    def release(self, request_id: str, wait_s: float = 10.0) -> bool:
        """Revoke a grant; wait until none of its pages is being copied.

        Idempotent. Returns False only if copies were still running after `wait_s`.
        """
        with self._cond:
            grant = self._grants.pop(request_id, None)
            if grant is None:
                return True
            grant.revoked = True
            return self._cond.wait_for(lambda: grant.inflight == 0, timeout=wait_s)

    def allowed(self, request_id: str, reader: str | None = None) -> bool:
        """The grant is live and, if it is bound to an engine and `reader` is given, bound
        to `reader` (a release or keep-alive from another engine is ignored)."""
        with self._cond:
            grant = self._grants.get(request_id)
            if grant is None or grant.deadline <= self.clock():
                return False
            return reader is None or grant.reader is None or grant.reader == reader

    def __len__(self) -> int:
        with self._cond:
            return len(self._grants)

    # -- serving side -----------------------------------------------------------------
    def check_read(self, request_id: str, pages: Sequence[PageCopy], reader: str = "") -> Grant:
        """Validate a whole read by `reader` before copying anything; return its grant."""
        with self._cond:
            grant = self._live(request_id)
            if grant.reader is not None and grant.reader != reader:
                raise TransferRefused(
                    f"request {request_id!r} is granted to engine {grant.reader!r}, not {reader!r}"
                )
            for i, page in enumerate(pages):
                allowed = grant.blocks.get(page.group)
                if allowed is None:
                    raise TransferRefused(
                        f"request {request_id!r}: group {page.group} is not allowed (page {i})"
                    )
                if page.src not in allowed:
                    raise TransferRefused(
                        f"request {request_id!r}: block {page.src} of group {page.group} is "
                        f"not allowed (page {i})"
                    )
                want = self.layout.page_bytes[page.group]
                if page.nbytes != want:
                    raise TransferRefused(
                        f"request {request_id!r}: page {i} asks {page.nbytes} bytes, group "
                        f"{page.group} pages are {want} bytes here (geometry mismatch)"
                    )
            grant.reader = reader
            return grant

    def begin(self, grant: Grant) -> None:
        """Mark a copy of the grant's pages as running (raises if no longer valid)."""
        with self._cond:
            if grant.revoked:
                raise TransferRefused(f"request {grant.request_id!r} was released")
            if grant.expired or grant.deadline <= self.clock():
                raise LeaseExpired(f"request {grant.request_id!r}: lease expired")
            grant.inflight += 1

    def end(self, grant: Grant) -> None:
        with self._cond:
            grant.inflight -= 1
            if grant.inflight == 0:
                self._cond.notify_all()

    def sweep_expired(self) -> list[str]:
        """Drop grants whose lease ran out; return their request ids (for P's engine)."""
        now = self.clock()
        with self._cond:
            gone = [rid for rid, g in self._grants.items() if g.deadline <= now]
            for rid in gone:
                self._grants.pop(rid).expired = True
                self._expired[rid] = None
            while len(self._expired) > REMEMBER_EXPIRED:
                self._expired.popitem(last=False)
            return gone

    def _live(self, request_id: str) -> Grant:
        grant = self._grants.get(request_id)
        if grant is None:
            if request_id in self._expired:
                raise LeaseExpired(f"request {request_id!r}: lease expired")
            raise TransferRefused(f"request {request_id!r} is unknown or was released")
        if grant.deadline <= self.clock():
            raise LeaseExpired(f"request {request_id!r}: lease expired")
        return grant

    def check_invariants(self) -> None:
        with self._cond:
            for rid, grant in self._grants.items():
                assert grant.request_id == rid, (rid, grant.request_id)
                assert not grant.revoked and not grant.expired, rid
                assert grant.inflight >= 0, (rid, grant.inflight)
                for group, ids in grant.blocks.items():
                    assert 0 <= group < self.layout.num_groups, (rid, group)
                    assert all(NULL_BLOCK < b < self.layout.num_blocks for b in ids), rid
