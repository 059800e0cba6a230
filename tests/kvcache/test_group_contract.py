"""Every derived method of `GroupRules` against brute force over `needed(r)` (docs/design.md
§4-§8), for random geometries of every kind (full, sliding, chunked-local)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from relaykv.kvcache import CacheRequest, Geometry, GroupRules, cdiv, rules_for

from .strategies import ALL_MODES, geometries

SPAN = 160  # positions scanned by the brute force (windows and chunks are <= 24)


def _first_read_after(rule: GroupRules, processed: int) -> int:
    """Lowest block any position >= processed reads, by brute force over needed() (position q
    reads what a resume at q + tail needs: under `eagle_reuse=recompute` a resume at r computes
    r-1 first, §4)."""
    if processed <= 0:
        return 0
    return min(rule.needed(q + rule.tail).start for q in range(processed, processed + SPAN))


def _check_needed_shape(rule: GroupRules) -> None:
    previous = range(0)
    closed = True
    for r in range(1, SPAN):
        need = rule.needed(r)
        assert need.step == 1 and need.stop == r // rule.block_size + rule.peek
        assert need.start <= r // rule.block_size
        assert need.start >= previous.start  # ranges only move right
        if rule.reach is not None:  # nothing below position r - tail - reach + 1 is read
            assert need.start >= max(0, r - rule.tail - rule.reach + 1) // rule.block_size
        closed = closed and need.start == 0
        previous = need
    assert rule.needed(0) == range(0)
    if rule.reach is None:
        assert closed
    assert rule.prefix_closed == closed or (rule.reach is not None and rule.reach >= SPAN)


def _check_positions(rule: GroupRules, rng: random.Random) -> None:
    for f in range(0, (SPAN - 40) // rule.block_size):
        cap = rule.hit_cap_for_floor(f)
        brute = [r for r in range(1, SPAN) if rule.needed(r).start <= f]
        if rule.prefix_closed:
            assert cap is None
        else:
            assert cap == max(brute), f
    for blocks in range(0, SPAN // rule.block_size - 1):
        brute = [r for r in range(0, SPAN) if rule.needed(r).stop <= blocks]
        assert rule.last_point_within(blocks) == max(brute, default=0), blocks
    for upto in range(0, SPAN // 2):
        horizon = rule.hash_horizon(upto)
        if rule.prefix_closed:
            assert horizon is None
            continue
        assert horizon is not None and horizon >= upto
        end = upto // rule.block_size
        late = [r for r in range(horizon + 1, SPAN) if rule.needed(r).start < end]
        assert not late, (upto, horizon, late[:3])
    for p in range(0, SPAN // 2):
        assert rule.first_kept_block(p) == _first_read_after(rule, p), p
        floor = rng.randrange(0, SPAN)
        assert rule.first_kept_block(p, floor) == min(
            _first_read_after(rule, p), floor // rule.block_size
        )
        for f in range(0, p // rule.block_size + 1):
            brute = min(s for s in range(0, p + 1) if rule.first_kept_block(p - s) <= f)
            assert rule.slack_tokens(p, f) == brute, (p, f)
    points = [rng.randrange(1, SPAN) for _ in range(rng.randrange(0, 5))]
    mask = rule.retained_blocks(points)
    if rule.prefix_closed:
        assert mask is None
    else:
        assert mask == {i for r in points for i in rule.needed(r)}


def _check_worst_case(rule: GroupRules, rng: random.Random) -> None:
    max_len = rng.randrange(1, SPAN)
    in_flight = rng.randrange(1, 40)
    slack = rng.randrange(0, 30)
    worst = 0
    for p in range(0, max_len):
        top = cdiv(min(p + in_flight, max_len), rule.block_size)
        worst = max(worst, top - rule.first_kept_block(p - slack))
    bound = rule.worst_case_blocks(max_len, in_flight, slack) - rule.tail  # §4 copy source
    assert worst <= bound <= worst + 1, (max_len, in_flight, slack, worst, bound)


def _check_longest_hit(rule: GroupRules, geo: Geometry, rng: random.Random) -> None:
    keys = [bytes([i]) for i in range(rng.randrange(0, 40))]
    cached = {k for k in keys if rng.random() < 0.7}
    cap = rng.randrange(0, SPAN)
    brute = 0
    for r in range(cap // geo.alignment * geo.alignment, 0, -geo.alignment):
        need = rule.needed(r)
        if need.stop <= len(keys) and all(keys[i] in cached for i in need):
            brute = r
            break
    assert rule.longest_hit(keys, cached, cap) == brute
    matched = rule.matched_blocks(keys, cached, len(keys))
    if rule.prefix_closed:
        assert rule.longest_hit(keys, cached, cap) == rule.hit_from_matched(matched, cap)


@settings(max_examples=60, deadline=None)
@given(geometries(max_groups=3, modes=ALL_MODES), st.integers(0, 2**32 - 1))
def test_derived_methods_match_brute_force_over_needed(geo: Geometry, seed: int) -> None:
    rng = random.Random(seed)
    for rule in rules_for(geo):
        _check_needed_shape(rule)
        _check_positions(rule, rng)
        _check_worst_case(rule, rng)
        for _ in range(5):
            _check_longest_hit(rule, geo, rng)


@settings(max_examples=30, deadline=None)
@given(geometries(max_groups=3, modes=ALL_MODES), st.integers(2, 60))
def test_keyable_blocks_count_the_keys_a_prompt_has(geo: Geometry, n: int) -> None:
    rules = rules_for(geo)
    req = CacheRequest("r", list(range(n)), rules, geo.hash_unit)
    for rule in rules:
        assert rule.keyable_blocks(n) == len(req.keys(rule.index))
