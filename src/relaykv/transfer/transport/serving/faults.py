"""Failure injection for the serving side, for transport tests and engine-level tests.

A `FaultPlan` is installed on a `TransferServer` with `server.inject(plan)` (or passed to
the standalone peer process). Faults act where a real failure would: the reader sees the
same errors it would see in production (timeout, integrity, short, peer lost), and the
server keeps serving other requests (a delay never blocks the serving loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to break. Page indices count pages of one Read, in request order.

    * `drop`: ignore matching Read requests (the reader times out).
    * `delay_s`: hold every chunk this long before sending it.
    * `corrupt_page`: flip one byte of that page on its way (the reader's check fails).
    * `short`: leave out the last page yet claim completion (a short transfer).
    * `die_after_pages`: stop serving the transfer after K pages, silently; with
      `exit_process` the whole process exits there (`os._exit`), as a crash would.
    * `request_ids`: restrict the plan to these requests (None: every request).
    """

    drop: bool = False
    delay_s: float = 0.0
    corrupt_page: int | None = None
    short: bool = False
    die_after_pages: int | None = None
    exit_process: bool = False
    request_ids: frozenset[str] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.delay_s < 0:
            raise ValueError("delay_s must be >= 0")
        if self.corrupt_page is not None and self.corrupt_page < 0:
            raise ValueError("corrupt_page must be >= 0")
        if self.die_after_pages is not None and self.die_after_pages < 0:
            raise ValueError("die_after_pages must be >= 0")
        if self.exit_process and self.die_after_pages is None:
            raise ValueError("exit_process needs die_after_pages")
        if self.request_ids is not None:
            object.__setattr__(self, "request_ids", frozenset(self.request_ids))

    def applies(self, request_id: str) -> bool:
        return self.request_ids is None or request_id in self.request_ids

    @classmethod
    def from_dict(cls, data: dict) -> FaultPlan:
        """Build from JSON-style data (the standalone peer's `inject` command)."""
        data = dict(data)
        if data.get("request_ids") is not None:
            data["request_ids"] = frozenset(data["request_ids"])
        return cls(**data)


NO_FAULTS = FaultPlan()
