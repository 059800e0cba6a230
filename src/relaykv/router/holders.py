"""Which engines of a role hold a key: one bitmask map per group, shared by a router's indexes.

A decode engine under the `per-group` P/D policy reuses every prompt block it holds, not only
a prefix, so bounding its hit means counting the prompt's blocks it holds; a prefill engine's
lookup needs the run of held full-group blocks from block 0. Probing engine by engine costs
one probe per block per engine; `KeyHolders.group(g)` (key -> a bitmask of engine slots) lets
one pass over the prompt's keys count and measure the runs for every engine of the role at
once (`PromptCounts`). Each `EngineIndex` registered here keeps its bits up to date as its events
arrive. The map is kvcache's `KeyMasks`: where the accelerator is built, a C table holding the
16-byte keys inline whose pass over a prompt's keys overlaps their cache misses, else a dict
(docs/routing.md "Cost").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from relaykv.kvcache.accel import KeyMasks, key_masks, slot_counts, slot_held_py, slot_run_py
from relaykv.kvcache.decode_loads import reused_in_masks

MAX_SLOTS = 64  # bitmasks stay numpy uint64; later engines are counted one by one


class KeyHolders:
    def __init__(self) -> None:
        self.maps: list[KeyMasks] = []
        self._free = list(range(MAX_SLOTS - 1, -1, -1))

    def slot(self) -> int | None:
        return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def group(self, group: int) -> KeyMasks:
        while len(self.maps) <= group:
            self.maps.append(key_masks())
        return self.maps[group]

    def add(self, group: int, keys: Iterable[bytes], slot: int) -> None:
        self.group(group).or_bits(keys, 1 << slot)

    def discard(self, group: int, keys: Iterable[bytes], slot: int) -> None:
        self.group(group).clear_bits(keys, 1 << slot)


class PromptCounts:
    """How many of one prompt's keys in one group each slot holds, and each slot's run of
    held keys from key 0 (one pass over the holders map, then one C pass counting every
    slot at once, or numpy slot by slot without the accelerator)."""

    __slots__ = ("_array", "_counted", "_held_from_0", "_runs")

    def __init__(self, holders: KeyHolders, group: int, keys: Sequence[bytes]) -> None:
        self._array = holders.group(group).values(keys)
        self._counted = slot_counts(self._array)  # (held, runs) per slot; None: no C
        self._held_from_0: np.ndarray | None = None
        self._runs: dict[int, int] = {}

    def run(self, slot: int, limit: int) -> int:
        """The run of keys from key 0 that `slot` holds, within the first `limit`: kvcache's
        `matched_blocks` on that engine's map, without probing it."""
        if self._counted is not None:
            run = self._counted[1][slot]
        else:
            found = self._runs.get(slot)
            if found is None:
                if self._held_from_0 is None:  # per key, the slots holding every key to it
                    self._held_from_0 = np.bitwise_and.accumulate(self._array)
                found = self._runs[slot] = slot_run_py(self._held_from_0, slot)
            run = found
        return min(run, max(0, limit))

    def held(self, slot: int) -> int:
        if self._counted is not None:
            return self._counted[0][slot]
        return slot_held_py(self._array, slot)

    def reused(self, slot: int, start: int, stop: int, peek: int) -> np.ndarray:
        """kvcache's `reused_indices` of keys `start..stop-1` on the engine of `slot`, its
        probes read from the masks (`reused_in_masks`), without probing its map again."""
        return reused_in_masks(self._array, slot, start, stop, peek)
