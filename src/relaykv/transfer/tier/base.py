"""What every tier backend factory receives (docs/tier.md "Backends").

A factory builds one engine's `TierBackend` over that engine's KV pages. `kv_buffer` is the
executor's `[num_blocks, block_bytes]` page memory (a torch tensor on the engine's device);
`capacity_blocks` comes from `--kv-offloading-size` (GiB // block_bytes); `settings` holds
the backend's own flags by name (empty for `native`).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relaykv.kvcache import Geometry
from relaykv.kvcache.tier import TierBackend


@dataclass(frozen=True, slots=True)
class TierRequest:
    kv_buffer: Any
    geometry: Geometry
    capacity_blocks: int
    settings: Mapping[str, Any] = field(default_factory=dict)


TierFactory = Callable[[TierRequest], TierBackend]


T = TypeVar("T")


def drain(finished: queue.SimpleQueue[T]) -> list[T]:
    """Everything a worker thread put into `finished` so far (a backend's `poll`)."""
    out = []
    while True:
        try:
            out.append(finished.get_nowait())
        except queue.Empty:
            return out
