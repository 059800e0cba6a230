"""A brute-force oracle for the local lookup (docs/design.md §5).

It tries every aligned resume point from `floor((N-1)/A)*A` down to 0 and returns the first
at which every group holds every block of `needed(r)`. It shares nothing with the fast lookup
but the definition of `needed` (§4), which is what the contract states; tests compare the two
on random cache states.
"""

from __future__ import annotations

from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.lookup import CachedKeys
from relaykv.kvcache.request import CacheRequest


def oracle_hit(
    req: CacheRequest, rules: tuple[GroupRules, ...], pool: CachedKeys, cap: int | None = None
) -> int:
    n = req.num_tokens
    alignment = rules[0].alignment
    top = n - 1 if cap is None else min(cap, n - 1)
    r = max(0, top) // alignment * alignment
    while r > 0:
        if all(_group_holds(req, rule, pool, r) for rule in rules):
            return r
        r -= alignment
    return 0


def _group_holds(req: CacheRequest, rule: GroupRules, pool: CachedKeys, r: int) -> bool:
    keys = req.keys(rule.index)
    gmap = pool.maps[rule.index]
    return all(i < len(keys) and keys[i] in gmap for i in rule.needed(r))
