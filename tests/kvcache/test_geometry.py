from __future__ import annotations

import pytest

from relaykv.kvcache import Geometry, GroupSpec, parse_groups, preset


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
