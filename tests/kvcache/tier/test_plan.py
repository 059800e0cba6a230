"""TierPlan: offload boundaries, readiness and what each checkpoint stores (docs/tier.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaykv.kvcache import CacheRequest, Retention, rules_for
from relaykv.kvcache.tier import TierPlan, parse_interval

from ..conftest import geometry, tokens
from ..strategies import geometries


def test_interval_default_and_validation() -> None:
    assert parse_interval(None, 16) == 16
    assert parse_interval(None, 16, Retention("interval", 64)) == 64
    assert parse_interval(48, 16) == 48
    for bad in (0, -16, 24):
        with pytest.raises(ValueError, match="--kv-offloading-interval"):
            parse_interval(bad, 16)


def test_points_are_interval_multiples_plus_extra() -> None:
    plan = TierPlan(rules_for(geometry("full:16", "sliding:16:64")), 64)
    assert plan.points(0, 200) == [64, 128, 192]
    assert plan.points(64, 200, extra=[80, 81, 300]) == [80, 128, 192]


def test_worked_example_blocks() -> None:
    # full(b=16) + sliding(b=16, W=64), EAGLE draft in the sliding group (peek block).
    rules = rules_for(geometry("full:16", "sliding:16:64", draft=1))
    plan = TierPlan(rules, 64)
    full, sliding = plan.blocks(128, 64)
    assert full == range(4, 8)  # what the parent at 64 lacks
    assert sliding == rules[1].needed(128) == range(4, 9)  # window + peek block 8
    assert plan.ready_at(128) == 9 * 16  # the peek block must be written


@settings(max_examples=150, deadline=None)
@given(geo=geometries(max_groups=3), mult=st.integers(1, 3), n=st.integers(1, 120))
def test_chain_covers_needed(geo, mult, n) -> None:
    """Walking a sequence's checkpoints, each chain holds every group's needed(r)."""
    rules = rules_for(geo)
    plan = TierPlan(rules, geo.alignment * mult)
    req = CacheRequest("r", tokens(n, vocab=7), rules, geo.hash_unit)
    keys = [req.keys(g) for g in range(len(rules))]
    held: list[set[int]] = [set() for _ in rules]
    parent = 0
    for r in plan.points(0, n):
        if plan.ready_at(r) > n:
            break
        items = plan.items(keys, r, parent)
        if items is None:
            break
        for g, pairs in enumerate(items):
            if rules[g].prefix_closed:
                held[g].update(i for i, _ in pairs)
            else:
                held[g] = {i for i, _ in pairs}
        for g, need in enumerate(plan.covered(r)):
            assert set(need) <= held[g]
        parent = r
