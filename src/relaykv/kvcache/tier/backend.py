"""The protocol every KV tier implements (docs/tier.md "Backends").

The cache side (`offload.py`) decides what moves and when; a backend only moves bytes. It is
built over the engine's KV pages (the executor's `kv_buffer`, `[num_blocks, block_bytes]`)
by a factory the serving layer registers under its `--kv-offloading-backend` name
(`relaykv.transfer.tier.registry`).

Contract:
* `submit(job)` starts the job's copies and returns at once: copies run off the step's
  critical path (a worker thread, a CUDA stream, a network client).
* `poll()` returns the jobs that ended since the last call, each exactly once, with success.
  It runs on the engine's step thread; so do `submit` and `shutdown`.
* The cache guarantees that while a job is in flight nobody else writes its device blocks
  (a store's blocks are held; a load's blocks belong to a request that waits) and no other
  job writes its slots (the index pins them). A failed store leaves its slots unusable (the
  index drops them); a failed load leaves its device blocks as scratch (the request
  recomputes).
* `capacity_blocks` is how many blocks the tier holds; the index never hands out more slots.
* `medium` names the tier in KV events (vLLM's convention: "CPU" for host memory).

A *shared* tier (a store other engines write too, `SharedTierBackend`) also answers
`probe`: which blocks it holds that this engine did not store. The cache adopts the complete
checkpoints among them into its index before a lookup (`KVTier.discover`), so a hit can use
what another engine, or this engine before a restart, stored. Its `epoch` changes when the
store may have lost what it held (its master died): the cache then forgets its index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from relaykv.kvcache.tier.jobs import TierJob


class TierBackend(Protocol):
    @property
    def name(self) -> str:
        """The `--kv-offloading-backend` name (`native`, `mooncake`, ...)."""
        ...

    @property
    def medium(self) -> str:
        """The `medium` of this tier's KV events ("CPU" for host memory)."""
        ...

    @property
    def capacity_blocks(self) -> int:
        """Blocks the tier holds (slots `0 .. capacity_blocks - 1`)."""
        ...

    def submit(self, job: TierJob) -> None:
        """Start `job`'s copies; never waits for them."""
        ...

    def poll(self) -> list[tuple[TierJob, bool]]:
        """Jobs that ended since the last call, each once, with success."""
        ...

    def shutdown(self) -> None:
        """Stop accepting jobs and release the tier's memory (in-flight jobs may be lost)."""
        ...


@runtime_checkable
class SharedTierBackend(TierBackend, Protocol):
    @property
    def epoch(self) -> int:
        """Changes whenever the store may have lost blocks it held (forget the index)."""
        ...

    def probe(self, items: Sequence[tuple[int, bytes]]) -> list[bool]:
        """Which `(group, key)` blocks the store holds now (bounded in time; all False when
        it cannot tell)."""
        ...


class InstantTier:
    """A tier that moves no bytes: every job ends, successfully, at the next `poll`. For
    tools that drive the cache without KV memory (`relaykv cache-probe --tier-blocks`)."""

    name = "instant"
    medium = "CPU"

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._done: list[tuple[TierJob, bool]] = []

    def submit(self, job: TierJob) -> None:
        self._done.append((job, True))

    def poll(self) -> list[tuple[TierJob, bool]]:
        done, self._done = self._done, []
        return done

    def shutdown(self) -> None:
        self._done.clear()
