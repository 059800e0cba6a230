"""Which decode engines hold a key: one bitmask map per group, shared by a router's indexes.

A decode engine under the `per-group` P/D policy reuses every prompt block it holds, not only
a prefix, so bounding its hit means counting the prompt's blocks it holds. Counting engine by
engine costs one probe per block per engine; `KeyHolders.maps[g][key]` (a bitmask of engine
slots) lets one pass over the prompt's keys count for every engine at once
(`PromptCounts`). Each `EngineIndex` registered here keeps its bits up to date as its events
arrive (docs/routing.md "Cost").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from relaykv.kvcache.accel import values_u64

MAX_SLOTS = 64  # bitmasks stay numpy uint64; later engines are counted one by one


class KeyHolders:
    def __init__(self) -> None:
        self.maps: list[dict[bytes, int]] = []
        self._free = list(range(MAX_SLOTS - 1, -1, -1))

    def slot(self) -> int | None:
        return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def group(self, group: int) -> dict[bytes, int]:
        while len(self.maps) <= group:
            self.maps.append({})
        return self.maps[group]

    def add(self, group: int, keys: Iterable[bytes], slot: int) -> None:
        gmap = self.group(group)
        bit = 1 << slot
        get = gmap.get
        for key in keys:
            gmap[key] = get(key, 0) | bit

    def discard(self, group: int, keys: Iterable[bytes], slot: int) -> None:
        gmap = self.group(group)
        keep = ~(1 << slot)
        for key in keys:
            mask = gmap.get(key)
            if mask is not None:
                mask &= keep
                if mask:
                    gmap[key] = mask
                else:
                    del gmap[key]


class PromptCounts:
    """How many of one prompt's keys in one group each slot holds (one pass, in C where
    kvcache's accelerator is built, then numpy)."""

    __slots__ = ("_array",)

    def __init__(self, holders: KeyHolders, group: int, keys: Sequence[bytes]) -> None:
        self._array = values_u64(holders.group(group), keys)

    def held(self, slot: int) -> int:
        return int(np.count_nonzero(self._array & np.uint64(1 << slot)))

    def found(self, slot: int, start: int, stop: int) -> np.ndarray:
        """Per key `start..stop-1`, 1 where `slot` holds it, else 0: an engine's probes for
        kvcache's `reused_indices`, without probing its map again."""
        return (self._array[start:stop] >> np.uint64(slot)) & np.uint64(1)
