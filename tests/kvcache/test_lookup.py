"""The exact hybrid lookup against the brute-force oracle (docs/design.md §5)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relaykv.cache_probe.oracle import oracle_hit
from relaykv.kvcache import KVCacheManager, find_longest_hit

from .conftest import Driver, geometry, tokens
from .strategies import ALL_MODES, geometries, related_prompts


@settings(max_examples=300, deadline=None)
@given(geometries(modes=ALL_MODES), related_prompts(count=3), st.data())
def test_lookup_equals_oracle_on_arbitrary_cache_states(geo, prompts, data) -> None:
    """Cache random subsets of blocks (not just prefixes), then compare every lookup."""
    m = KVCacheManager(geo, 4096)
    for i, prompt in enumerate(prompts[:-1]):
        req = m.add_request(f"src{i}", prompt)
        m._allocate(req, len(prompt))
        for rule in m.rules:
            keys = req.keys(rule.index)
            subset = data.draw(st.sets(st.integers(0, max(0, len(keys) - 1))))
            m.pool.cache_blocks(
                rule.index, [(req.tables[rule.index][k], keys[k]) for k in subset if k < len(keys)]
            )
        m.release(req)
    query = m.add_request("q", prompts[-1])
    hit = find_longest_hit(query, m.rules, m.pool)
    assert hit.tokens == oracle_hit(query, m.rules, m.pool)
    for rule in m.rules:
        keys = query.keys(rule.index)
        blocks = hit.blocks[rule.index]
        assert len(blocks) == hit.tokens // rule.block_size
        for k in rule.needed(hit.tokens) if hit.tokens else ():
            if k < len(blocks):
                assert blocks[k] == m.pool.maps[rule.index][keys[k]]


def test_worked_example_colocated_resend_hits_976(worked_example) -> None:
    d = Driver(KVCacheManager(worked_example, 512))
    prompt = tokens(1000)
    req, hit = d.prefill(prompt)
    assert hit == 0
    d.decode(req)
    d.finish(req)
    req, hit = d.prefill(prompt)
    assert hit == 976


def test_full_draft_group_matches_one_more_block_then_drops_it() -> None:
    geo = geometry("full:16", draft=0)
    d = Driver(KVCacheManager(geo, 256))
    prompt = tokens(48)
    req, _ = d.prefill(prompt)
    d.finish(req)
    # 48 tokens: r=32 needs blocks 0,1 plus the peek block 2 = [32, 48), all in the prompt.
    assert d.prefill(prompt)[1] == 32
    assert d.prefill(tokens(37, seed=5))[1] == 0  # another prompt
    assert d.prefill(prompt[:37])[1] == 16


def test_successor_keys_need_no_drop() -> None:
    geo = geometry("full:16", draft=0, reuse="successor")
    d = Driver(KVCacheManager(geo, 256))
    prompt = tokens(48)
    req, _ = d.prefill(prompt)
    d.finish(req)
    # Block 2 ends at 48, and its successor key needs token 48, which the prompt lacks.
    assert d.prefill(prompt)[1] == 32
    assert d.prefill(prompt[:37])[1] == 32


def test_cache_salt_separates_tenants(worked_example) -> None:
    d = Driver(KVCacheManager(worked_example, 512))
    prompt = tokens(300)
    req, _ = d.prefill(prompt, salt="a")
    d.finish(req)
    assert d.prefill(prompt, salt="b")[1] == 0
    assert d.prefill(prompt, salt="a")[1] > 0


def test_junction_is_kept_for_a_third_sibling() -> None:
    # Retention `boundaries` keeps only replay windows; a lookup that proves a longer shared
    # prefix in the full groups pins the window there, so the next sibling hits it (§6).
    geo = geometry("full:16", "sliding:16:32")
    d = Driver(KVCacheManager(geo, 512))
    x = tokens(256, seed=1)
    for seed, expect in ((2, 0), (3, 0), (4, 256)):
        req, hit = d.prefill(x + tokens(40, seed=seed))
        assert hit == expect
        d.finish(req)
