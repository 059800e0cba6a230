"""The engine's recent steps: when each ran and what its batch held (`GET /steps`).

One `StepRecord` per executed step: its start and end on `time.perf_counter()` (the
host's monotonic clock, the one `relaykv bench` stamps requests with, so a client on the
same host can place each token gap among the steps that ran meanwhile) and, per sequence
in the batch, its request id, what the step did for it and how many tokens it fed:

* `prefill`: prompt tokens computed here (a colocated request, P's prefill, or a request a
  decode engine prefills itself: a local request of conditional disaggregation);
* `load`: a request whose prompt KV was delivered (P/D), in the step that recomputes its
  last prompt position;
* `decode`: output tokens (and the draft's proposals, `draft_tokens`).

The engine thread appends; readers take a snapshot under a lock. The log keeps the last
steps whose batches hold at most `STEP_LOG_ENTRIES` sequence entries in all (a few MB: 8,192
steps of 8 sequences, a few minutes of a busy engine on a CPU; fewer steps of larger
batches).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

STEP_LOG_ENTRIES = 65_536


class StepWork(NamedTuple):
    request_id: str
    kind: str  # prefill | load | decode
    tokens: int
    draft_tokens: int


class StepRecord(NamedTuple):
    start: float  # time.perf_counter() before the batch ran
    end: float
    work: tuple[StepWork, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "start": self.start,
            "end": self.end,
            "work": [w._asdict() for w in self.work],
        }


def work_kind(start_position: int, num_prompt_tokens: int, delivered: bool) -> str:
    """What a step does for a sequence whose work starts at `start_position`: `delivered`
    is a request whose prompt KV came from a prefill engine."""
    if start_position >= num_prompt_tokens:
        return "decode"
    if delivered and start_position == num_prompt_tokens - 1:
        return "load"
    return "prefill"


class StepLog:
    def __init__(self, entries: int = STEP_LOG_ENTRIES) -> None:
        self._records: deque[StepRecord] = deque()
        self._entries = 0  # sequence entries of the kept records
        self._limit = entries
        self._lock = threading.Lock()

    def add(self, start: float, end: float, work: Sequence[StepWork]) -> None:
        record = StepRecord(start, end, tuple(work))
        with self._lock:
            self._records.append(record)
            self._entries += len(record.work)
            while self._entries > self._limit and len(self._records) > 1:
                self._entries -= len(self._records.popleft().work)

    def since(self, t: float = float("-inf")) -> list[StepRecord]:
        """The kept steps that ended at or after `t`, oldest first."""
        with self._lock:
            records = list(self._records)
        return [r for r in records if r.end >= t]
