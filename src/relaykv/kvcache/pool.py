"""The shared block pool: reference counts, the free queue, and the hash maps (docs/design.md §3).

One pool serves every group; a block id is a page in whichever group owns it. Block 0 is the
null block: a placeholder in block tables, never allocated, freed, counted, touched or cached.

The free queue is kept as three segments that together are exactly the single queue of §3:

    [scratch: freed blocks without a hash, most recently freed first]
    [fresh:   never-used blocks, in id order]
    [cached:  freed blocks with a hash, least recently freed first (LRU)]

Scratch blocks are reused first (their contents are worthless); cached blocks are reused last
and stay hittable until popped (lazy eviction). Only cached blocks can be `touch`ed out of the
queue, because only they can be found by a lookup, so the scratch and fresh segments never need
removal from the middle. Keeping the segments separate makes every operation O(1) per block
without per-block Python objects, which is what lets a 64k-token hit fit in a few milliseconds.

Safety contract for callers:
* `allocate(n)` requires `n <= num_free`; it returns blocks with `ref_cnt == 1` and no hash.
* `touch` and `free` take each block at most once per call; `free` takes blocks in eviction
  priority order (first = evicted first), so callers pass a request's blocks tail first.
* A hash is attached with `cache_block` only to a block whose KV is fully written (§7: received
  blocks only after the transfer completes). A key already present keeps its block: identical
  content is not cached twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

NULL_BLOCK = 0


@dataclass(frozen=True, slots=True)
class KVEvent:
    """A change to what the pool can serve: `stored`, `removed` (per group) or `cleared`.

    The pool fills kind, group, keys and block ids; the cache manager adds, for `stored`
    events of a request's blocks, the key of the block before the first one (`parent`) and
    the tokens the stored blocks cover (`token_ids`), which KV event consumers expect.
    `medium` is None for the device pool; a KV tier's events name it (vLLM's convention:
    "CPU" for host memory; docs/tier.md).
    """

    kind: Literal["stored", "removed", "cleared"]
    group: int = -1
    keys: tuple[bytes, ...] = ()
    block_ids: tuple[int, ...] = ()
    parent: bytes | None = None
    token_ids: tuple[int, ...] = ()
    medium: str | None = None


EventSink = Callable[[KVEvent], None]


class BlockPool:
    """Reference-counted blocks shared by all groups, with per-group hash maps."""

    def __init__(
        self,
        num_blocks: int,
        num_groups: int,
        enable_caching: bool = True,
        on_event: EventSink | None = None,
    ) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"a pool needs at least 2 blocks (one is the null block), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.num_groups = num_groups
        self.enable_caching = enable_caching
        self.on_event = on_event
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_key: list[bytes | None] = [None] * num_blocks
        self.block_group: list[int] = [-1] * num_blocks
        self.maps: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        self._scratch: list[int] = []  # stack: the end is the head of the queue
        self._next_fresh = 1  # blocks [_next_fresh, num_blocks) were never used
        self._cached: OrderedDict[int, None] = OrderedDict()  # first = next victim
        self.evictions = 0
        # Bumped whenever a key leaves the maps (eviction, uncache, reset): a hit looked up
        # at an unchanged epoch still holds (`KVCacheManager.admit(hit=...)`).
        self.key_epoch = 0

    # -- capacity ------------------------------------------------------------------
    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._scratch) + (self.num_blocks - self._next_fresh) + len(self._cached)

    def usage(self) -> float:
        """Fraction of usable blocks held by requests (the null block excluded)."""
        return 1.0 - self.num_free / self.num_usable

    # -- lookup --------------------------------------------------------------------
    def cached_block(self, group: int, key: bytes) -> int | None:
        return self.maps[group].get(key)

    # -- allocation ----------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Pop `n` blocks from the head of the free queue, evicting cached ones lazily."""
        if n > self.num_free:
            raise RuntimeError(f"cannot allocate {n} blocks: only {self.num_free} free")
        out: list[int] = []
        scratch = self._scratch
        while scratch and len(out) < n:
            out.append(scratch.pop())
        take = min(n - len(out), self.num_blocks - self._next_fresh)
        if take > 0:
            out.extend(range(self._next_fresh, self._next_fresh + take))
            self._next_fresh += take
        removed: dict[int, list[bytes]] = {}
        while len(out) < n:
            block, _ = self._cached.popitem(last=False)
            key = self.block_key[block]
            if key is not None:
                group = self.block_group[block]
                del self.maps[group][key]
                self.block_key[block] = None
                self.block_group[block] = -1
                removed.setdefault(group, []).append(key)
                self.evictions += 1
                self.key_epoch += 1
            out.append(block)
        ref = self.ref_cnt
        for block in out:
            ref[block] = 1
        if removed and self.on_event is not None:
            for group, keys in removed.items():
                self.on_event(KVEvent("removed", group, tuple(keys)))
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take hit blocks (§3): out of the free queue if idle, then `ref_cnt += 1`."""
        ref = self.ref_cnt
        cached = self._cached
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            if ref[block] == 0:
                del cached[block]
            ref[block] += 1

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block; idle ones join the free queue (§3)."""
        ref = self.ref_cnt
        key = self.block_key
        cached = self._cached
        scratch_batch: list[int] = []
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            count = ref[block] - 1
            if count < 0:
                raise RuntimeError(f"double free of block {block}")
            ref[block] = count
            if count == 0:
                if key[block] is None:
                    scratch_batch.append(block)
                else:
                    cached[block] = None
        if scratch_batch:
            # The batch goes to the head in order: its first block is reused first.
            self._scratch.extend(reversed(scratch_batch))

    # -- caching -------------------------------------------------------------------
    def cache_block(self, block: int, group: int, key: bytes) -> bool:
        """Publish a written block under `key` in `group`; False if not cached."""
        if not self.enable_caching or block == NULL_BLOCK or self.ref_cnt[block] == 0:
            return False  # only held blocks with written KV are published
        current = self.block_key[block]
        if current is not None:
            return current == key and self.block_group[block] == group
        gmap = self.maps[group]
        if key in gmap:
            return False
        gmap[key] = block
        self.block_key[block] = key
        self.block_group[block] = group
        if self.on_event is not None:
            self.on_event(KVEvent("stored", group, (key,), (block,)))
        return True

    def cache_blocks(self, group: int, pairs: Iterable[tuple[int, bytes]]) -> int:
        """Publish many `(block, key)` pairs of one group; returns how many were cached."""
        if not self.enable_caching:
            return 0
        gmap = self.maps[group]
        bkey = self.block_key
        bgroup = self.block_group
        ref = self.ref_cnt
        stored_keys: list[bytes] = []
        stored_blocks: list[int] = []
        for block, key in pairs:
            if block == NULL_BLOCK or bkey[block] is not None or key in gmap or not ref[block]:
                continue
            gmap[key] = block
            bkey[block] = key
            bgroup[block] = group
            stored_keys.append(key)
            stored_blocks.append(block)
        if stored_keys and self.on_event is not None:
            self.on_event(KVEvent("stored", group, tuple(stored_keys), tuple(stored_blocks)))
        return len(stored_keys)

    def uncache(self, blocks: Iterable[int]) -> None:
        """Drop the hashes of blocks (e.g. KV found invalid) without freeing them."""
        for block in blocks:
            key = self.block_key[block]
            if block == NULL_BLOCK or key is None:
                continue
            group = self.block_group[block]
            del self.maps[group][key]
            self.block_key[block] = None
            self.block_group[block] = -1
            self.key_epoch += 1
            if self.ref_cnt[block] == 0:
                # An idle block without a hash belongs to the scratch segment.
                del self._cached[block]
                self._scratch.append(block)
            if self.on_event is not None:
                self.on_event(KVEvent("removed", group, (key,)))

    def reset(self) -> bool:
        """Forget every hash; only allowed when no block is in use."""
        if self.num_free != self.num_usable:
            return False
        for block in list(self._cached):
            self.block_key[block] = None
            self.block_group[block] = -1
            self._scratch.append(block)
        self._cached.clear()
        for gmap in self.maps:
            gmap.clear()
        self.key_epoch += 1
        if self.on_event is not None:
            self.on_event(KVEvent("cleared"))
        return True

    # -- introspection (tests, invariant checker) ------------------------------------
    def free_queue(self) -> list[int]:
        """The free queue from the next victim onward (for tests pinning eviction order)."""
        return (
            list(reversed(self._scratch))
            + list(range(self._next_fresh, self.num_blocks))
            + list(self._cached)
        )

    def check(self) -> list[str]:
        """Violations of the §3 invariants (empty when the pool is consistent)."""
        problems: list[str] = []
        queue = self.free_queue()
        in_queue = set(queue)
        if len(in_queue) != len(queue):
            problems.append("a block appears twice in the free queue")
        if NULL_BLOCK in in_queue:
            problems.append("the null block is in the free queue")
        if self.block_key[NULL_BLOCK] is not None:
            problems.append("the null block carries a hash")
        for block in range(1, self.num_blocks):
            ref = self.ref_cnt[block]
            if ref < 0:
                problems.append(f"block {block} has ref_cnt {ref}")
            if (ref == 0) != (block in in_queue):
                problems.append(f"block {block}: ref_cnt {ref} but in_queue={block in in_queue}")
        for block in self._scratch:
            if self.block_key[block] is not None:
                problems.append(f"scratch block {block} carries a hash")
        for block in self._cached:
            if self.block_key[block] is None:
                problems.append(f"cached-segment block {block} has no hash")
        for block in range(self._next_fresh, self.num_blocks):
            if self.block_key[block] is not None:
                problems.append(f"fresh block {block} carries a hash")
        for group, gmap in enumerate(self.maps):
            for key, block in gmap.items():
                if block == NULL_BLOCK:
                    problems.append(f"group {group} maps a key to the null block")
                elif self.block_key[block] != key or self.block_group[block] != group:
                    problems.append(f"group {group} maps a key to block {block} not carrying it")
        for block in range(1, self.num_blocks):
            carried = self.block_key[block]
            if carried is not None and self.maps[self.block_group[block]].get(carried) != block:
                problems.append(f"block {block} carries a hash its group's map does not know")
        held = sum(1 for b in range(1, self.num_blocks) if self.ref_cnt[b] > 0)
        if held + self.num_free != self.num_usable:
            problems.append(f"held {held} + free {self.num_free} != usable {self.num_usable}")
        return problems
