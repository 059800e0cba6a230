from __future__ import annotations

import pytest

from relaykv.kvcache import Geometry, GroupSpec, LayerGroup, group_layers, parse_groups, preset


def test_alignment_is_lcm_and_hash_unit_is_gcd() -> None:
    g = Geometry(parse_groups("full:32,sliding:8:64,sliding:12:48"))
    assert g.alignment == 96
    assert g.hash_unit == 4


def test_presets() -> None:
    oss = preset("gpt-oss-like")
    assert [s.kind for s in oss.groups] == ["full", "sliding"]
    assert oss.draft_groups == (0,) and oss.eagle
    gemma = preset("gemma3-like")
    assert gemma.groups[1].window == 512 and not gemma.eagle
    assert gemma.groups[1].num_layers == 5 * gemma.groups[0].num_layers
    dsv4 = preset("dsv4-like")
    assert dsv4.alignment == 256 and dsv4.hash_unit == 4
    assert dsv4.groups[dsv4.draft_groups[0]].kind == "sliding"
    with pytest.raises(ValueError, match="unknown preset"):
        preset("nope")


def test_eagle_without_marked_group_marks_every_group() -> None:
    g = Geometry((GroupSpec("full", 16), GroupSpec("sliding", 16, window=64)), eagle=True)
    assert g.draft_groups == (0, 1)
    assert Geometry(g.groups).draft_groups == ()


def test_with_draft_moves_the_mark() -> None:
    g = preset("gpt-oss-like").with_draft(1)
    assert g.draft_groups == (1,)
    assert g.with_draft(None).eagle is False
    with pytest.raises(ValueError, match="out of range"):
        g.with_draft(5)


@pytest.mark.parametrize("text", ["full", "full:x", "sliding:16", "window:16:2", "full:0"])
def test_parse_groups_rejects_bad_specs(text: str) -> None:
    with pytest.raises(ValueError):
        parse_groups(text)


def test_group_spec_validation() -> None:
    with pytest.raises(ValueError):
        GroupSpec("sliding", 16)
    with pytest.raises(ValueError):
        GroupSpec("full", 16, window=8)


FULL = ("full", None, 1, 64)
SLIDING = ("sliding", 512, 1, 64)


def test_group_layers_splits_the_larger_kind_into_interleaved_groups() -> None:
    # Gemma-3: 15 sliding, 3 full -> the full group first, then 5 sliding groups of 3.
    keys = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(18)]
    groups = group_layers(keys)
    assert [(g.key, g.num_layers) for g in groups] == [(FULL, 3)] + [(SLIDING, 3)] * 5
    sliding = [i for i, k in enumerate(keys) if k == SLIDING]
    assert groups[1].layers == tuple(sliding[0::5]) and groups[5].layers == tuple(sliding[4::5])


def test_group_layers_keeps_kinds_whole_under_one_and_a_half_times() -> None:
    # gpt-oss-like: 12 sliding, 13 full: splitting would only add groups.
    keys = [SLIDING, FULL] * 12 + [FULL]
    assert [g.num_layers for g in group_layers(keys)] == [13, 12]
    assert [g.num_layers for g in group_layers([FULL] * 6)] == [6]


def test_group_layers_puts_the_draft_last_in_the_first_group_of_its_key() -> None:
    keys = [SLIDING, FULL] * 2
    assert group_layers(keys, FULL) == (
        LayerGroup(FULL, (1, 3), draft=True),
        LayerGroup(SLIDING, (0, 2)),
    )
    assert group_layers(keys, FULL)[0].num_layers == 3
    # No target layer of the draft's key: the draft gets a group of its own.
    assert group_layers([SLIDING] * 2, FULL) == (
        LayerGroup(FULL, (), draft=True),
        LayerGroup(SLIDING, (0, 1)),
    )
