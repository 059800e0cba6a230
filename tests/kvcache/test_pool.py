from __future__ import annotations

import pytest

from relaykv.kvcache import BlockPool, KVEvent


def test_null_block_is_never_handed_out() -> None:
    pool = BlockPool(5, 1)
    assert pool.num_free == 4
    assert sorted(pool.allocate(4)) == [1, 2, 3, 4]
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    assert pool.check() == []


def test_free_queue_order_scratch_first_cached_lru_last() -> None:
    # The order vLLM's test_prefill pins: uncached blocks of the last freed request first,
    # then never-used blocks, then cached blocks in free order (each request tail first).
    pool = BlockPool(11, 1)
    a = pool.allocate(4)  # 1..4: three full hashed blocks and a partial tail
    pool.cache_blocks(0, [(a[0], b"h1"), (a[1], b"h2"), (a[2], b"h3")])
    pool.touch(a[:3])  # a sibling hits the three cached blocks
    b = pool.allocate(1)  # 5
    pool.free(list(reversed(a)))  # request A, tail first
    pool.free(list(reversed(a[:3] + b)))  # request B
    assert pool.free_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert pool.allocate(10) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert pool.check() == []


def test_lazy_eviction_and_touch() -> None:
    events: list[KVEvent] = []
    pool = BlockPool(3, 2, on_event=events.append)
    [x] = pool.allocate(1)
    assert pool.cache_block(x, 1, b"k")
    pool.free([x])
    assert pool.cached_block(1, b"k") == x  # still hittable while idle
    pool.touch([x])
    assert pool.ref_cnt[x] == 1 and pool.num_free == 1
    pool.free([x])
    pool.allocate(2)  # pops the fresh block, then evicts x
    assert pool.cached_block(1, b"k") is None
    assert [e.kind for e in events] == ["stored", "removed"] and pool.evictions == 1
    assert pool.check() == []


def test_duplicate_keys_are_not_cached_twice() -> None:
    pool = BlockPool(4, 1)
    x, y = pool.allocate(2)
    assert pool.cache_block(x, 0, b"k")
    assert not pool.cache_block(y, 0, b"k")
    pool.free([x, y])
    assert pool.free_queue()[0] == y  # the unhashed duplicate is scratch
    assert pool.check() == []


def test_double_free_is_an_error() -> None:
    pool = BlockPool(3, 1)
    [x] = pool.allocate(1)
    pool.free([x])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([x])


def test_uncache_and_reset() -> None:
    pool = BlockPool(4, 1)
    x, y = pool.allocate(2)
    pool.cache_blocks(0, [(x, b"a"), (y, b"b")])
    pool.free([x])
    assert not pool.reset()  # y is in use
    pool.uncache([x, y])
    assert pool.cached_block(0, b"a") is None and pool.free_queue()[0] == x
    assert pool.cache_block(y, 0, b"c")
    pool.free([y])
    assert not pool.cache_block(y, 0, b"d")  # an idle block is never published
    assert pool.reset() and pool.cached_block(0, b"c") is None
    assert pool.check() == []
    assert pool.usage() == 0.0


def test_checker_detects_corruption() -> None:
    pool = BlockPool(4, 1)
    [x] = pool.allocate(1)
    pool.ref_cnt[x] = 0
    assert pool.check()
