"""The decode-side reuse rule (design §7 `per-group`): which held blocks D reuses, and how
many prompt tokens that covers in every full group."""

from __future__ import annotations

import numpy as np
import pytest

from relaykv.kvcache import CacheRequest, CacheRole, accel, rules_for
from relaykv.kvcache.decode_loads import (
    reusable_blocks,
    reused_indices,
    tokens_local_in,
    units_covered,
    units_covered_py,
)
from relaykv.kvcache.groups import GroupRules

from .conftest import geometry, tokens


def test_reused_indices_keep_held_blocks_and_under_the_peek_only_proven_ones() -> None:
    found = np.array([5, 0, 7, 9, 0, 3], dtype=np.int64)  # blocks 2..7
    assert reused_indices(found, 2, 8, 0).tolist() == [2, 4, 5, 7]
    # Peek: block k is reused only when block k+1 is held too; found has one past stop.
    assert reused_indices(found, 2, 7, 1).tolist() == [4]
    # Without the probe past stop (the prompt ends there) the last block is not proven.
    assert reused_indices(found[:5], 2, 7, 1).tolist() == [4]
    assert reused_indices(found[:0], 3, 3, 1).tolist() == []


def test_tokens_local_in_counts_units_reused_in_every_full_group() -> None:
    rules = rules_for(geometry("full:16", "full:32", "sliding:16:64"))
    local = [np.array([0, 1, 2]), np.array([0]), np.array([], dtype=np.int64)]
    # Units of 16 tokens: group 0 covers 0..47, group 1 covers 0..31; sliding is ignored.
    assert tokens_local_in(rules, 16, local, 100) == 32
    # Never the whole prompt: the last token is always computed.
    assert tokens_local_in(rules, 16, local, 32) == 31
    only_sliding = rules_for(geometry("sliding:16:64"))
    assert tokens_local_in(only_sliding, 16, [np.array([1])], 64) == 16
    assert tokens_local_in(rules, 16, local, 10) == 0


def _tokens_local_by_unit(
    rules: list[GroupRules], unit: int, local: list[np.ndarray], n: int
) -> int:
    """`tokens_local_in` unit by unit: the oracle its vectorised form is checked against."""
    full = [r for r in rules if r.prefix_closed] or rules
    count = 0
    for j in range(n // unit):
        start = j * unit
        count += all(start // r.block_size in set(local[r.index].tolist()) for r in full)
    return min(count * unit, n - 1)


@pytest.mark.parametrize("native", [True, False], ids=["accelerator", "numpy"])
def test_tokens_local_in_equals_the_unit_by_unit_count(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kvcache's count, in C where the accelerator is built and in numpy, against the oracle.
    if not native:
        monkeypatch.setattr(accel, "native", None)
    elif accel.native is None:
        pytest.skip("C accelerator not built")
    rng = np.random.default_rng(21)
    shapes = [("full:16",), ("full:16", "sliding:16:64"), ("full:16", "full:32", "full:48"),
              ("sliding:16:64", "sliding:32:64"), ("full:32", "sliding:16:32")]
    for trial in range(300):
        rules = rules_for(geometry(*shapes[trial % len(shapes)]))
        # the hash unit, or one dividing no block (a caller's own unit: 24)
        unit = [16, 8, 24][trial % 3] if trial % 7 else 16
        n = int(rng.integers(0, 400))
        # sorted distinct indices, as reused_indices gives them, or in any order with repeats
        drawn = [rng.integers(-2, n // r.block_size + 3, int(rng.integers(0, 30))) for r in rules]
        local = [np.unique(d) if trial % 2 else d for d in drawn]
        got = tokens_local_in(rules, unit, local, n)
        assert got == _tokens_local_by_unit(list(rules), unit, local, n), (trial, unit, n)


def test_reusable_blocks_maps_reused_indices_to_the_engine_s_block_ids() -> None:
    geo = geometry("full:16", draft=0)
    rules = rules_for(geo)
    (rule,) = rules
    req = CacheRequest("r", tokens(80), rules, geo.hash_unit, role=CacheRole.DECODE)
    keys = req.keys(0)
    gmap = {keys[0]: 11, keys[1]: 12, keys[3]: 14, keys[4]: 15}
    # The draft group under the EAGLE drop: block 1 lacks its successor, block 4 is last.
    assert reusable_blocks(req, rule, gmap, range(0, 5)) == {0: 11, 3: 14}
    assert reusable_blocks(req, rule, gmap, range(5, 5)) == {}


def test_units_covered_refuses_what_it_cannot_count() -> None:
    for count in (units_covered, units_covered_py):
        assert count(16, 0, [(16, np.array([0, 1]))]) == 0
        assert count(16, 3, []) == 3
    if accel.native is not None:
        with pytest.raises(ValueError):
            units_covered(0, 3, [(16, np.array([0]))])
        with pytest.raises(ValueError):
            units_covered(16, 3, [(0, np.array([0]))])
        with pytest.raises(TypeError):
            accel.native.units_covered(16, 3, [(16,)])
        with pytest.raises(ValueError, match="whole int64"):
            accel.native.units_covered(16, 3, [(16, b"\x00" * 9)])
