"""Chunked-local attention (Llama-4's local layers): a position reads only its own chunk.

The kind is one file, `kvcache/groups/chunked.py`; these tests pin its rules and show that the
rest of the cache (lookup, retention, P/D plan, sizing, cache-probe) serves it exactly.
"""

from __future__ import annotations

import json

import pytest

from relaykv.cache_probe.probe import run_probe
from relaykv.cli import main
from relaykv.kvcache import Geometry, GroupSpec, KVCacheManager, parse_groups, rules_for

from .conftest import Driver, tokens


def _chunked(block: int = 4, chunk: int = 16, draft: bool = False):
    geo = Geometry((GroupSpec("chunked", block, chunk=chunk, draft=draft),))
    return rules_for(geo)[0]


def test_needed_is_the_chunk_below_r() -> None:
    rule = _chunked()
    assert rule.needed(20) == range(4, 5)  # chunk [16, 32): block 4 holds 16..19
    assert rule.needed(16) == range(4, 4)  # on a chunk boundary nothing earlier is read
    assert rule.needed(15) == range(0, 3)
    assert _chunked(draft=True).needed(16) == range(4, 5)  # the peek block


def test_whole_chunks_are_dead_behind_the_request() -> None:
    rule = _chunked()
    assert [rule.first_kept_block(p) for p in (0, 15, 16, 31, 32)] == [0, 0, 4, 4, 8]
    assert rule.first_kept_block(40, floor_token=20) == 5
    assert rule.worst_case_blocks(4096, 64, 0) == 21  # cdiv(16 - 1 + 64, 4) + 1
    assert rule.hit_cap_for_floor(4) == 31  # r in [16, 32) starts at block 4


def test_spec_parse_and_describe() -> None:
    (spec,) = parse_groups("chunked:16:8192")
    assert spec == GroupSpec("chunked", 16, chunk=8192)
    assert spec.describe() == "chunked(b=16, C=8192)"
    with pytest.raises(ValueError, match="needs a chunk"):
        GroupSpec("chunked", 16)
    with pytest.raises(ValueError, match="has no chunk"):
        GroupSpec("sliding", 16, window=8, chunk=8)
    with pytest.raises(ValueError, match="bad group"):
        parse_groups("chunked:16")


def test_resend_hits_and_chunks_are_freed_on_the_way() -> None:
    # Llama-4-like: full + chunked-local layers, chunk 32 tokens, block 8.
    geo = Geometry((GroupSpec("full", 8), GroupSpec("chunked", 8, chunk=32)))
    d = Driver(KVCacheManager(geo, 256))
    prompt = tokens(100)
    req, hit = d.prefill(prompt, chunk=24)
    assert hit == 0
    assert req.tables[1][:8] == [0] * 8  # chunks [0, 64) are behind position 100: freed
    d.finish(req)
    again, hit = d.prefill(prompt)
    assert hit == 96  # the oracle agrees (Driver checks every lookup against it)
    d.finish(again)


def test_decode_engine_hits_like_a_colocated_one() -> None:
    geo = Geometry((GroupSpec("full", 16), GroupSpec("chunked", 16, chunk=64, draft=True)))
    result = run_probe(geo, "exact", 1000)
    for case in ("resend", "extension"):
        assert result["decode"][case]["local_tokens"] == result["colocated"][case] > 0


def test_cache_probe_accepts_chunked_groups(capsys) -> None:
    assert main(["cache-probe", "--groups", "full:16,chunked:16:64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["pd_policy"] for r in rows] == ["legacy", "replay-slack", "exact", "per-group"]
    assert rows[2]["decode"]["resend"]["local_tokens"] == rows[2]["colocated"]["resend"]
