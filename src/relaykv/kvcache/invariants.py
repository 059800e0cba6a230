"""The invariant checker of a cache manager (docs/design.md §3, §7). Tests run it after every step.

Beyond the pool's own checks (`BlockPool.check`), it verifies that the manager's view agrees
with the pool's: every block's reference count equals the number of live block-table entries
pointing at it, full-group tables hold no nulls, sliding tables hold nulls only below their
real blocks, and blocks of in-flight loads carry no hash.
"""

from __future__ import annotations

from collections import Counter

from relaykv.kvcache.base import CacheLifecycle
from relaykv.kvcache.manager import KVCacheManager
from relaykv.kvcache.pool import NULL_BLOCK


def check_manager(manager: KVCacheManager) -> list[str]:
    pool = manager.pool
    problems = list(pool.check())
    refs: Counter[int] = Counter()
    tables_seen = [req for req in manager.requests.values()]
    for req in tables_seen:
        refs.update(source for _, source, _ in req.copies)  # held until the copy ran (§4)
        for rule in manager.rules:
            table = req.tables[rule.index]
            refs.update(b for b in table if b != NULL_BLOCK)
            if rule.prefix_closed:
                if NULL_BLOCK in table:
                    problems.append(f"{req.request_id}: full group {rule.index} holds a null")
            else:
                real = [i for i, b in enumerate(table) if b != NULL_BLOCK]
                if real and any(table[i] == NULL_BLOCK for i in range(real[0], real[-1] + 1)):
                    problems.append(f"{req.request_id}: group {rule.index} has a hole")
            if len(set(b for b in table if b)) != sum(1 for b in table if b):
                problems.append(f"{req.request_id}: group {rule.index} repeats a block")
    if manager.tier is not None:
        refs.update(manager.tier.held_blocks())  # device blocks in-flight stores hold
        problems.extend(f"tier: {p}" for p in manager.tier.index.check(manager.tier.plan))
    for block in range(1, pool.num_blocks):
        if pool.ref_cnt[block] != refs.get(block, 0):
            problems.append(
                f"block {block}: ref_cnt {pool.ref_cnt[block]}, "
                f"but {refs.get(block, 0)} table entries and tier stores"
            )
    for load in manager.loads.active.values():
        for items in load.receive:
            for _, block in items:
                if load.pending and pool.block_key[block] is not None:
                    problems.append(f"load {load.load_id}: in-flight block {block} is hashed")
    for group, registry in enumerate(manager.loads.inflight):
        for load, block in registry.values():
            if not load.pending:
                problems.append(f"group {group}: finished load {load.load_id} still registered")
            if pool.ref_cnt[block] == 0:
                problems.append(f"group {group}: registered in-flight block {block} is free")
            if pool.block_key[block] is not None:
                problems.append(f"group {group}: registered in-flight block {block} is hashed")
    return problems


def assert_consistent(cache: CacheLifecycle) -> None:
    problems = cache.check()
    if problems:
        raise AssertionError("cache invariants violated:\n  " + "\n  ".join(problems[:20]))
