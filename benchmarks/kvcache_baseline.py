"""A straightforward cache manager, the baseline `bench_kvcache.py` compares against.

It is what one writes first, the way vLLM 0.33.0 does it: one Python object per block in an
intrusive doubly-linked free list, SHA-256 over pickled `(parent, tokens, extra)` tuples, a
dict from (hash, group) to block, and per-block loops everywhere. It serves a full + sliding
geometry with the EAGLE draft in the full group, with dense sliding retention.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    key: tuple[bytes, int] | None = None
    prev: Block | None = None
    next: Block | None = None


class FreeList:
    def __init__(self, blocks: list[Block]) -> None:
        self.head = Block(-1)
        self.tail = Block(-2)
        self.head.next, self.tail.prev = self.tail, self.head
        for b in blocks:
            self.append(b)

    def append(self, b: Block) -> None:
        last = self.tail.prev
        assert last is not None
        last.next, b.prev, b.next, self.tail.prev = b, last, self.tail, b

    def prepend(self, b: Block) -> None:
        first = self.head.next
        assert first is not None
        self.head.next, b.prev, b.next, first.prev = b, self.head, first, b

    def remove(self, b: Block) -> None:
        assert b.prev is not None and b.next is not None
        b.prev.next, b.next.prev = b.next, b.prev
        b.prev = b.next = None

    def popleft(self) -> Block:
        b = self.head.next
        assert b is not None and b is not self.tail
        self.remove(b)
        return b


def hash_blocks(tokens: list[int], block: int) -> list[bytes]:
    out, parent = [], b"seed"
    for i in range(0, len(tokens) - len(tokens) % block, block):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i : i + block]), None))).digest()
        out.append(parent)
    return out


class BaselineManager:
    """Group 0: full (draft, EAGLE drop); group 1: sliding window `window`; block size b."""

    def __init__(self, num_blocks: int, block: int, window: int) -> None:
        self.b, self.window = block, window
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_list = FreeList(self.blocks[1:])
        self.cached: dict[tuple[bytes, int], Block] = {}
        self.num_free = num_blocks - 1

    def lookup(self, hashes: list[bytes], n: int) -> tuple[int, list[list[Block]]]:
        b, need = self.b, -(-(self.window - 1) // self.b)
        full: list[Block] = []
        for h in hashes[: (n - 1) // b + 1]:
            blk = self.cached.get((h, 0))
            if blk is None:
                break
            full.append(blk)
        hit_blocks = max(0, len(full) - 1)  # EAGLE: match one more block, then drop it
        while hit_blocks > 0:
            start = max(0, hit_blocks * b - self.window + 1) // b
            window = [self.cached.get((hashes[i], 1)) for i in range(start, hit_blocks)]
            if all(w is not None for w in window) and len(window) >= min(need, hit_blocks):
                return hit_blocks * b, [full[:hit_blocks], [Block(0)] * start + window]
            hit_blocks -= 1
        return 0, [[], []]

    def touch(self, blocks: list[Block]) -> None:
        for blk in blocks:
            if blk.block_id == 0:
                continue
            if blk.ref_cnt == 0:
                self.free_list.remove(blk)
                self.num_free -= 1
            blk.ref_cnt += 1

    def allocate(self, n: int) -> list[Block]:
        out = []
        for _ in range(n):
            blk = self.free_list.popleft()
            if blk.key is not None:
                del self.cached[blk.key]
                blk.key = None
            blk.ref_cnt = 1
            out.append(blk)
        self.num_free -= n
        return out

    def cache(self, tables: list[list[Block]], hashes: list[bytes]) -> None:
        for group, table in enumerate(tables):
            for i, blk in enumerate(table):
                if i < len(hashes) and blk.block_id != 0 and blk.key is None:
                    key = (hashes[i], group)
                    if key not in self.cached:
                        blk.key = key
                        self.cached[key] = blk

    def free(self, tables: list[list[Block]]) -> None:
        for table in tables:
            for blk in reversed(table):
                if blk.block_id == 0:
                    continue
                blk.ref_cnt -= 1
                if blk.ref_cnt == 0:
                    self.num_free += 1
                    if blk.key is None:
                        self.free_list.prepend(blk)
                    else:
                        self.free_list.append(blk)
