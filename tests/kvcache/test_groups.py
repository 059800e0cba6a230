"""Per-kind rules (docs/design.md §4, §6), including the cases vLLM's tests pin."""

from __future__ import annotations

import pytest

from relaykv.kvcache import rules_for

from .conftest import geometry


def _sliding(window: int, block: int, draft: bool = False, extra: str | None = None):
    groups = [f"sliding:{block}:{window}"] + ([extra] if extra else [])
    return rules_for(geometry(*groups, draft=0 if draft else None))[0]


@pytest.mark.parametrize(
    ("pattern", "expected_blocks"),
    [
        ("F" * 10, 0),
        ("T", 1),
        ("TF", 1),
        ("TT", 2),
        ("TTTF", 3),
        ("TTFTFFTTFTTT", 12),
        ("TTFTFFTTFFF", 8),
    ],
)
def test_sliding_hit_from_cached_pattern(pattern: str, expected_blocks: int) -> None:
    # W=4, b=2: a hit at r needs blocks [(r-3)//2, r/2) - vLLM's possible_cached_prefix cases.
    rule = _sliding(4, 2)
    keys = [bytes([i]) for i in range(len(pattern))]
    cached = {keys[i] for i, c in enumerate(pattern) if c == "T"}
    assert rule.longest_hit(keys, cached, cap=2 * len(pattern)) == 2 * expected_blocks


@pytest.mark.parametrize(("processed", "freed"), [(4, 0), (5, 1), (6, 1), (7, 2), (11, 4)])
def test_sliding_first_kept_block(processed: int, freed: int) -> None:
    # W=4, b=2: after n tokens the next position reads [n-3, n]; whole blocks below are dead.
    assert _sliding(4, 2).first_kept_block(processed) == freed


def test_retention_floor_keeps_more() -> None:
    rule = _sliding(128, 16)
    assert rule.first_kept_block(1000) == 54
    assert rule.first_kept_block(1000, floor_token=53 * 16) == 53


def test_needed_blocks_with_and_without_peek() -> None:
    plain = _sliding(128, 16)
    draft = _sliding(128, 16, draft=True)
    assert plain.needed(976) == range(53, 61)
    assert draft.needed(976) == range(53, 62)  # the peek block 61 (§7 worked example)
    assert plain.needed(64) == range(0, 4)  # below the window: everything from 0
    full = rules_for(geometry("full:16", "sliding:16:128", draft=0))[0]
    assert full.needed(976) == range(0, 62)


def test_sliding_hit_respects_alignment() -> None:
    # b=8 in a geometry with A=32: a run may only end on a multiple of 32.
    rule = rules_for(geometry("sliding:8:8", "full:32"))[0]
    keys = [bytes([i]) for i in range(12)]
    cached = {keys[i] for i in (4, 5, 6, 7, 9, 10)}
    # r=64 needs block 7 (W=8 -> [57, 64)): cached; r=80 would need block 9 but is not aligned.
    assert rule.longest_hit(keys, cached, cap=95) == 64
