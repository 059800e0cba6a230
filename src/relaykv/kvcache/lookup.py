"""The exact hybrid lookup: the largest resume point every group can serve (docs/design.md §5).

A resume point r is valid when r is a multiple of A, r <= N-1, and every group holds
`needed(r)` (§4, EAGLE peek included). Prefix-closed (full) groups are downward closed, so
they are looked up once; the others (sliding, chunked) are not, so each is asked for its
largest valid point below the current candidate and the groups are intersected until the
candidate stops shrinking. Every step keeps the true answer r* below the candidate (each
group's answer is >= r* whenever the candidate is), and a fixed point is valid in every
group, so the result equals r*: the brute-force oracle (`relaykv.cache_probe.oracle`) checks
this on random inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.pool import NULL_BLOCK
from relaykv.kvcache.request import CacheRequest


class CachedKeys(Protocol):
    """Per-group maps key -> block: a `BlockPool`, or a router's index of an engine."""

    @property
    def maps(self) -> Sequence[Mapping[bytes, int]]: ...


@dataclass(slots=True)
class LocalHit:
    """A local prefix hit: resume at `tokens`, with the blocks each group reuses.

    `blocks[g]` has one entry per block index below `tokens // b_g`; null entries sit below a
    sliding window (and where `tier` names a block to load). `junction` is the longest shared
    prefix the full groups proved (aligned, EAGLE rules applied) when it exceeds the hit: the
    windows there are worth keeping (§6).
    """

    tokens: int
    blocks: list[list[int]]
    junction: int = 0
    # Per group, `(block index, tier slot)` of blocks the hit loads from the KV tier (their
    # `blocks` entries are nulls until allocated; docs/tier.md). Empty without a tier.
    tier: list[list[tuple[int, int]]] = field(default_factory=list)
    # The pool's `key_epoch` when `KVCacheManager.lookup` found it (-1: not stamped); `admit`
    # takes a handed-over hit as is only at an unchanged epoch.
    epoch: int = -1

    @property
    def num_tier_blocks(self) -> int:
        return sum(len(loads) for loads in self.tier)

    @property
    def num_blocks(self) -> int:
        return sum(1 for table in self.blocks for b in table if b != NULL_BLOCK)


def find_longest_hit(
    req: CacheRequest, rules: tuple[GroupRules, ...], pool: CachedKeys, cap: int | None = None
) -> LocalHit:
    """The exact local hit of `req` against `pool` (§5). `cap` defaults to N-1."""
    candidate, proven_shared, cap = resume_point(req, rules, pool, cap)
    keys = [req.keys(g) for g in range(len(rules))]
    maps = pool.maps
    blocks = []
    for rule in rules:
        gmap, gkeys = maps[rule.index], keys[rule.index]
        count = candidate // rule.block_size
        need = rule.needed(candidate)
        start = need.start if candidate > 0 else 0
        table = [NULL_BLOCK] * start + list(map(gmap.__getitem__, gkeys[start:count]))
        blocks.append(table)
    return LocalHit(candidate, blocks, hit_junction(rules, candidate, proven_shared, cap))


def hit_junction(
    rules: tuple[GroupRules, ...], candidate: int, proven_shared: int | None, cap: int
) -> int:
    """A hit's junction (`LocalHit.junction`): the junction point of what the full groups
    proved shared, when it lies beyond the hit (0 otherwise)."""
    if proven_shared is None or proven_shared <= candidate:
        return 0
    junction = junction_point(rules, proven_shared, cap)
    return junction if junction > candidate else 0


# `matched(rule, limit)`: what `rule.matched_blocks(keys, pool's map, limit)` returns for a
# prefix-closed group, known to the caller without probing the map (a router reads it from
# its map of which engines hold each key, relaykv.router.holders).
MatchedRun = Callable[[GroupRules, int], int]


def longest_hit_tokens(
    req: CacheRequest,
    rules: tuple[GroupRules, ...],
    pool: CachedKeys,
    cap: int | None = None,
    matched: MatchedRun | None = None,
) -> int:
    """`find_longest_hit(...).tokens` without building the block tables: what a router
    scoring an engine's index needs (one probe per block fewer)."""
    return resume_point(req, rules, pool, cap, matched)[0]


def resume_point(
    req: CacheRequest,
    rules: tuple[GroupRules, ...],
    pool: CachedKeys,
    cap: int | None,
    matched: MatchedRun | None = None,
) -> tuple[int, int | None, int]:
    """(the exact resume point, tokens the full groups proved shared, the aligned cap); the
    tier's lookup (`tier/lookup.py`) runs it over pool + tier. `matched`: the full groups'
    runs from block 0, when the caller knows them (`MatchedRun`)."""
    n = req.num_tokens
    cap = n - 1 if cap is None else min(cap, n - 1)
    alignment = rules[0].alignment
    cap = max(0, cap) // alignment * alignment
    keys = [req.keys(g) for g in range(len(rules))]
    maps = pool.maps

    candidate = cap
    proven_shared = None  # tokens the full groups proved shared with some cached prefix
    for rule in rules:
        if rule.prefix_closed:
            limit = cap // rule.block_size + rule.peek
            if matched is None:
                run = rule.matched_blocks(keys[rule.index], maps[rule.index], limit)
            else:
                run = matched(rule, limit)
            shared = run * rule.block_size
            proven_shared = shared if proven_shared is None else min(proven_shared, shared)
            candidate = min(candidate, rule.hit_from_matched(run, cap))
    dropping = [rule for rule in rules if not rule.prefix_closed]
    while candidate > 0:
        shrunk = candidate
        for rule in dropping:
            shrunk = rule.longest_hit(keys[rule.index], maps[rule.index], shrunk)
            if shrunk == 0:
                break
        if shrunk == candidate:
            break
        candidate = shrunk
    return candidate, proven_shared, cap


def junction_point(rules: tuple[GroupRules, ...], shared: int, cap: int) -> int:
    """Largest aligned r <= cap whose needs (peek blocks included) lie inside the first
    `shared` tokens: where two prompts sharing `shared` tokens can resume from each other's
    KV when every window is kept (the router's estimate for a prefix still being computed)."""
    limit = cap
    for rule in rules:
        limit = min(limit, rule.last_point_within(shared // rule.block_size))
    return rules[0].align_down(limit)
