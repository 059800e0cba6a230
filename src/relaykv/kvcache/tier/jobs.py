"""The copies between the device pool and a tier (docs/tier.md "Jobs").

A job is one batch of block copies in one direction: a `store` copies device blocks into tier
slots (the device blocks are held by the tier until the job is reported), a `load` copies tier
slots into device blocks a request allocated (the request waits in the scheduler's loading
queue until the job is reported, as for a P/D load). A backend reports every job exactly once,
as done or failed, in any order (`TierBackend.poll`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class JobKind(Enum):
    STORE = "store"  # device block -> tier slot
    LOAD = "load"  # tier slot -> device block


@dataclass(frozen=True, slots=True)
class TierCopy:
    """One block: `group`'s block keyed `key`, between device block `block` and tier `slot`.

    A slot-addressed backend (host memory) uses `slot`; a key-addressed one (a shared store)
    uses `(group, key)`; both are always given."""

    group: int
    key: bytes
    slot: int
    block: int


@dataclass(eq=False, slots=True)
class TierJob:
    job_id: int
    kind: JobKind
    copies: tuple[TierCopy, ...]
    request_id: str | None = None  # a load: the request that waits for it

    @property
    def num_blocks(self) -> int:
        return len(self.copies)
