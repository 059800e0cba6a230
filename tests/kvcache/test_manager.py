"""Manager flows: admission, skipping, retention, P/D holds and loads (docs/design.md §3-§8)."""

from __future__ import annotations

import pytest

from relaykv.kvcache import CacheRole, KVCacheManager, assert_consistent, pd_plan

from .conftest import Driver, geometry, tokens


def test_allocate_refuses_without_changing_anything() -> None:
    m = KVCacheManager(geometry("full:16", "sliding:16:32"), 8)
    d = Driver(m)
    req = d.new(tokens(200))
    before = m.pool.num_free
    assert not m._allocate(req, 200)
    assert m.pool.num_free == before and req.tables == [[], []]
    assert_consistent(m)


def test_must_fit_uses_the_sliding_cap() -> None:
    # A 200-token prompt needs 13 full blocks but at most cdiv(31 + 16, 16) + 1 = 4 sliding
    # blocks at a time (in-flight 16): 17 fit in a pool of 18 usable blocks.
    m = KVCacheManager(geometry("full:16", "sliding:16:32"), 19, max_in_flight_tokens=16)
    assert m.sizing.caps[1] == 4
    req = m.add_request("a", tokens(200))
    assert m._can_fit(req, 200)
    assert m._allocate(req, 16, must_fit=200)
    m2 = KVCacheManager(geometry("full:16", "sliding:16:32"), 17, max_in_flight_tokens=16)
    assert not m2._can_fit(m2.add_request("a", tokens(200)), 200)


def test_sliding_frees_follow_processed_tokens_and_keep_boundary_windows() -> None:
    geo = geometry("full:16", "sliding:16:32")
    m = KVCacheManager(geo, 64)
    d = Driver(m)
    req, _ = d.prefill(tokens(160), chunk=48)
    # After 160 tokens the next position reads [129, 160]: sliding blocks 0..7 are free.
    assert req.tables[1][:8] == [0] * 8 and all(req.tables[1][8:])
    # Only the replay boundaries' windows were hashed (boundaries retention, §6).
    hashed = [k for k, b in enumerate(m.requests[req.request_id].tables[0]) if b]
    assert len(hashed) == 10
    sliding_cached = {k for k in range(10) if req.keys(1)[k] in m.pool.maps[1]}
    # Replay boundaries 144 (resend) and 160 (extension): windows [113, 144) and [129, 160).
    assert sliding_cached == {7, 8, 9}
    d.finish(req)


def test_dense_and_interval_retention() -> None:
    geo = geometry("full:16", "sliding:16:16")
    for retention, expect in (("dense", set(range(10))), ("interval:64", {3, 7, 8, 9})):
        m = KVCacheManager(geo, 64, retention=retention)
        req, _ = Driver(m).prefill(tokens(160), chunk=32)
        assert {k for k in range(10) if req.keys(1)[k] in m.pool.maps[1]} == expect, retention


def test_preempted_request_resumes_from_its_own_cache() -> None:
    m = KVCacheManager(geometry("full:16", "sliding:16:64"), 64)
    d = Driver(m)
    req, _ = d.prefill(tokens(300))
    d.decode(req, 5)
    m.release(req)  # preemption by recompute: blocks go back, hashes stay
    again = m.add_request("again", list(req.tokens))
    assert m._lookup(again).tokens > 0
    assert_consistent(m)


def test_prefill_role_holds_the_plan_and_frees_the_rest() -> None:
    geo = geometry("full:16", "sliding:16:128", draft=1)
    m = KVCacheManager(geo, 256, pd_policy="exact", pd_role=True)
    d = Driver(m)
    req, _ = d.prefill(tokens(1000), role=CacheRole.PREFILL, chunk=256)
    held = m.hold_for_transfer(req)
    plan = pd_plan(geo, "exact", 1000)
    assert [[k for k, _ in g] for g in held] == [list(r) for r in plan.held]
    assert m.pool.num_free == 255 - plan.held_blocks()
    assert_consistent(m)
    m.release(req)
    assert m.pool.num_free == 255
    assert_consistent(m)


def test_prefill_hit_never_starts_above_the_plan_floor() -> None:
    geo = geometry("full:16", "sliding:16:128", draft=1)
    m = KVCacheManager(geo, 512, pd_policy="exact", pd_role=True)
    d = Driver(m)
    prompt = tokens(1008)
    first, _ = d.prefill(prompt, role=CacheRole.PREFILL)
    d.finish(first)
    again, hit = d.prefill(prompt, role=CacheRole.PREFILL)
    assert 0 < hit < 992  # the plan needs block 52 (window of 976): the hit stops lower
    m.hold_for_transfer(again)  # raises if a planned block were missing


def _pd(geo, policy="per-group", blocks=512):
    p = KVCacheManager(geo, blocks, pd_policy=policy, pd_role=True)
    d = KVCacheManager(geo, blocks, pd_policy=policy, pd_role=True)
    return Driver(p), Driver(d)


def test_received_blocks_are_hashed_only_on_completion() -> None:
    geo = geometry("full:16", "sliding:16:64")
    _, d = _pd(geo)
    prompt = tokens(300)
    req = d.new(prompt, CacheRole.DECODE)
    load = d.m.receive(req)
    assert load is not None and load.needs_transfer
    sibling = d.m.add_request("sib", prompt)
    assert d.m._lookup(sibling).tokens == 0  # nothing in flight is hittable
    assert_consistent(d.m)
    [settled] = d.m.load_finished(load, ok=True)
    assert settled is load and load.ok
    assert d.m._lookup(sibling).tokens > 0
    assert_consistent(d.m)


def test_concurrent_loads_of_the_same_prefix_share_one_transfer() -> None:
    geo = geometry("full:16", "sliding:16:64")
    _, d = _pd(geo)
    x = tokens(512)
    first = d.m.receive(d.new(x + tokens(20, seed=1), CacheRole.DECODE))
    second = d.m.receive(d.new(x + tokens(20, seed=2), CacheRole.DECODE))
    assert first is not None and second is not None
    assert len(second.attached[0]) == 32  # all of x's full blocks
    assert len(second.attached[1]) == 3  # x's part of the window of N-1 (blocks 29..31)
    assert second.waits_on == {first}
    assert len(second.receive[0]) == 2  # only its own tail in the full group
    assert d.m.stats.loads_coalesced == 1
    assert d.m.load_finished(second, ok=True) == []  # still waits on the first transfer
    settled = d.m.load_finished(first, ok=True)
    assert set(settled) == {first, second} and all(s.ok for s in settled)
    assert_consistent(d.m)


def test_failed_shared_load_fails_its_waiters_and_leaks_nothing() -> None:
    geo = geometry("full:16", "sliding:16:64")
    _, d = _pd(geo)
    x = tokens(512)
    a, b = d.new([*x, 1], CacheRole.DECODE), d.new([*x, 2], CacheRole.DECODE)
    first, second = d.m.receive(a), d.m.receive(b)
    d.m.load_finished(second, ok=True)
    settled = d.m.load_finished(first, ok=False)
    assert {s.request.request_id for s in settled} == {a.request_id, b.request_id}
    assert not any(s.ok for s in settled)
    sibling = d.m.add_request("sib", [*x, 3])
    assert d.m._lookup(sibling).tokens == 0  # the failed load published nothing
    d.m.release(sibling)
    d.finish(a)
    d.finish(b)
    assert d.m.pool.num_free == d.m.pool.num_usable
    assert d.m.stats.loads_failed == 1


def test_request_freed_mid_transfer_keeps_its_blocks_until_the_transfer_settles() -> None:
    geo = geometry("full:16", "sliding:16:64")
    _, d = _pd(geo)
    req = d.new(tokens(300), CacheRole.DECODE)
    load = d.m.receive(req)
    d.m.release(req)
    assert d.m.pool.num_free < d.m.pool.num_usable  # the transport may still write
    assert_consistent(d.m)
    assert d.m.load_finished(load, ok=True) == []
    assert d.m.pool.num_free == d.m.pool.num_usable
    assert d.m._lookup(d.m.add_request("again", tokens(300))).tokens > 0  # valid KV published


def test_load_refused_when_the_pool_is_full() -> None:
    geo = geometry("full:16", "sliding:16:64")
    _, d = _pd(geo, blocks=10)
    req = d.new(tokens(300), CacheRole.DECODE)
    assert d.m.receive(req) is None
    assert req.tables == [[], []]
    assert_consistent(d.m)


def test_stats_sum_to_prompt_tokens() -> None:
    geo = geometry("full:16", "sliding:16:64")
    _p, d = _pd(geo)
    prompt = tokens(300)
    for _ in range(2):
        req = d.new(prompt, CacheRole.DECODE)
        load = d.m.receive(req)
        if not load.delivered:
            d.m.load_finished(load, ok=True)
        d.finish(req)
    s = d.m.stats
    assert s.tokens_local_compute + s.tokens_local_cache_hit + s.tokens_external_kv_transfer == 600
    assert s.prefix_cache_queries == 600 and s.prefix_cache_hits == 288
    assert s.external_prefix_cache_hits == 299 + 299 - 288


def test_duplicate_request_id_rejected() -> None:
    m = KVCacheManager(geometry("full:16"), 8)
    m.add_request("a", [1, 2])
    with pytest.raises(ValueError, match="already known"):
        m.add_request("a", [1])
    with pytest.raises(ValueError, match="at least one"):
        m.add_request("b", [])


@pytest.mark.parametrize("chunk", [None, 48, 32, 17, 16])
@pytest.mark.parametrize("draft", [None, 1])
def test_chunked_prefill_keeps_the_windows_whole_prompt_caching_keeps(chunk, draft) -> None:
    # A replay boundary's window can start chunks before the boundary is reached (W=64,
    # b=16: the window of 96 is blocks 2..5, filled by chunks ending at 48 and 96). Blocks
    # are hashed once, when they fill, so the mask must see boundaries ahead of `upto`;
    # otherwise block 2 is never hashed and every later hit on this prefix is 0.
    geo = geometry("full:16", "sliding:16:64", draft=draft)
    whole = KVCacheManager(geo, 64)
    chunked = KVCacheManager(geo, 64)
    prompt = tokens(102)
    for m, size in ((whole, None), (chunked, chunk)):
        d = Driver(m)
        req, _ = d.prefill(prompt, chunk=size)
        cached = {k for k in range(6) if req.keys(1)[k] in m.pool.maps[1]}
        d.finish(req)
        resend, hit = d.prefill(prompt)  # asserts the hit equals the brute-force oracle
        d.finish(resend)
        assert_consistent(m)
    whole_cached = {k for k in range(6) if req.keys(1)[k] in whole.pool.maps[1]}
    assert cached == whole_cached
    assert hit == (96 if draft is None else 80)


def test_lookup_cap_bounds_the_hit_and_admit_takes_the_handed_hit() -> None:
    m = KVCacheManager(geometry("full:16", "sliding:16:32"), 64, retention="dense")
    d = Driver(m)
    first, _ = d.prefill(tokens(80))
    d.finish(first)
    req = m.add_request("again", tokens(80))
    assert m.lookup(req).tokens == 64
    capped = m.lookup(req, cap=40)
    assert capped.tokens == 32 and capped.epoch == m.pool.key_epoch
    # The handed hit is taken as is (no second lookup): same blocks, same resume point.
    admission = m.admit(req, 80, hit=capped)
    assert admission is not None and admission.start == 32
    assert req.tables[0][:2] == capped.blocks[0]
    assert_consistent(m)


def test_admit_looks_up_again_when_a_key_left_the_pool_since() -> None:
    m = KVCacheManager(geometry("full:16"), 64)
    d = Driver(m)
    first, _ = d.prefill(tokens(80))
    d.finish(first)
    req = m.add_request("again", tokens(80))
    hit = m.lookup(req)
    assert hit.tokens == 64
    m.pool.uncache(hit.blocks[0][3:])  # drops block 3's key
    assert m.pool.key_epoch != hit.epoch
    admission = m.admit(req, 80, hit=hit, cap=64)
    assert admission is not None and admission.start == 48
    assert_consistent(m)


def test_external_tokens_get_blocks_and_free_the_windows_below_them() -> None:
    # A connector writes tokens [16, 96) of a 100-token prompt; 4 are computed here.
    m = KVCacheManager(geometry("full:16", "sliding:16:32"), 64)
    d = Driver(m)
    first, _ = d.prefill(tokens(20))
    d.finish(first)
    req = m.add_request("loaded", tokens(100))
    hit = m.lookup(req)
    assert hit.tokens == 16
    admission = m.admit(req, 100, hit=hit, external=80)
    assert admission is not None and admission.start == 16 and admission.num_tokens == 4
    assert len(req.tables[0]) == 7 and all(req.tables[0])
    # Position 96 reads [65, 96]: sliding blocks 0..3 are never read here.
    assert req.tables[1][:4] == [0] * 4 and all(req.tables[1][4:])
    # Nothing past the hit is keyed until commit says it is written.
    assert req.num_cached_blocks[0] == 1
    m.commit(req, 100)
    assert req.num_cached_blocks[0] == 6
    with pytest.raises(ValueError, match="external tokens"):
        m.admit(m.add_request("x", tokens(10)), 1, external=11)
    assert_consistent(m)


def test_admit_keeps_the_reserved_blocks_free() -> None:
    m = KVCacheManager(geometry("full:16"), 9)
    req = m.add_request("a", tokens(64))
    assert m.admit(req, 64, keep_free=5) is None and not any(req.tables)
    assert m.admit(req, 64, keep_free=4) is not None and m.pool.num_free == 4


def test_detached_preemption_holds_the_blocks_until_handed_back() -> None:
    m = KVCacheManager(geometry("full:16", "sliding:16:64"), 64)
    d = Driver(m)
    req, _ = d.prefill(tokens(100))
    held = sum(1 for table in req.tables for b in table if b)
    free = m.pool.num_free
    blocks = m.preempt(req, detach=True)
    assert len(blocks) == held and not any(req.tables) and m.pool.num_free == free
    # Re-admitted at once, it hits its own (still held, keyed) blocks.
    again = m.admit(req, 100)
    assert again is not None and again.start > 0
    m.free_detached(blocks)
    assert m.pool.num_free > free - held
    m.release(req)
    assert m.pool.num_free == m.pool.num_usable


def _recompute_pair(num_blocks: int = 64):
    """A manager under `eagle_reuse=recompute` holding a 64-token prompt's blocks, and a
    sibling sharing its first 48 tokens (not yet admitted)."""
    geo = geometry("full:16", "sliding:16:32", draft=1, reuse="recompute")
    m = KVCacheManager(geo, num_blocks, retention="dense")
    prefix = tokens(48, seed=1)
    first = m.add_request("first", [*prefix, *tokens(16, seed=2)])
    adm = m.admit(first, 64)
    assert adm is not None and adm.start == 0 and not first.copies
    m.commit(first, 64)
    m.release(first)
    return m, m.add_request("sibling", [*prefix, *tokens(20, seed=3)])


def test_eagle_recompute_hits_the_whole_shared_prefix_through_private_copies() -> None:
    """§4 `eagle_reuse=recompute`: the sibling resumes at 48 (the drop would stop at 32),
    computes from 47 into private copies of block 2 in both groups, and holds the cached
    sources until the step that copies them is committed."""
    m, sib = _recompute_pair()
    assert m.lookup(sib).tokens == 48
    cached = [m.pool.maps[g][sib.keys(g)[2]] for g in range(2)]
    adm = m.admit(sib, 68, lookahead=2)
    assert adm is not None and adm.hit.tokens == 48 and adm.start == 47 and adm.num_tokens == 21
    assert [(g, src) for g, src, _ in sib.copies] == [(0, cached[0]), (1, cached[1])]
    for g, src, private in sib.copies:
        assert sib.tables[g][2] == private != src and m.pool.block_key[private] is None
        assert m.pool.ref_cnt[src] == 1  # held for the copy, by no table
    assert m.stats.prefix_cache_hits == 47 and m.stats.tokens_local_compute == 64 + 21
    assert_consistent(m)
    m.commit(sib, 68)
    assert not sib.copies and all(m.pool.ref_cnt[src] == 0 for src in cached)
    assert all(m.pool.maps[g][sib.keys(g)[2]] == cached[g] for g in range(2))  # keys stay
    assert_consistent(m)
    m.release(sib)
    assert_consistent(m)
    assert m.pool.num_free == m.pool.num_usable


def test_eagle_recompute_sources_go_back_with_a_preemption() -> None:
    m, sib = _recompute_pair()
    assert m.admit(sib, 68) is not None
    sources = [src for _, src, _ in sib.copies]
    detached = m.preempt(sib, detach=True)  # a step in flight may still copy them
    assert set(sources) <= set(detached) and not sib.copies
    assert all(m.pool.ref_cnt[src] == 1 for src in sources)
    m.free_detached(detached)
    assert_consistent(m)
    readmitted = m.admit(sib, 68)
    assert readmitted is not None and readmitted.start == 47
    m.release(sib)
    assert_consistent(m)
    assert m.pool.num_free == m.pool.num_usable


def test_eagle_recompute_counts_the_private_copies_at_admission() -> None:
    """The admission gate counts one fresh block per group for the copies: a pool one block
    short refuses, changing nothing."""
    m, sib = _recompute_pair(num_blocks=64)
    hit = m.lookup(sib)
    need = m._blocks_needed(sib, 68, hit)
    spare = m.pool.num_free - need
    m2, sib2 = _recompute_pair(num_blocks=64 - spare - 1)  # the same state, one block short
    free = m2.pool.num_free
    assert m2.admit(sib2, 68) is None and not sib2.copies and m2.pool.num_free == free
    m3, sib3 = _recompute_pair(num_blocks=64 - spare)
    assert m3.admit(sib3, 68) is not None
    assert_consistent(m3)


def test_eagle_recompute_leaves_pd_loads_to_per_group_reuse() -> None:
    """A load computes only N-1 (§7): with a common-hit policy, recompute is refused."""
    geo = geometry("full:16", "sliding:16:32", draft=1, reuse="recompute")
    for policy in ("legacy", "exact", "replay-slack"):
        m = KVCacheManager(geo, 64, pd_policy=policy, pd_role=True)
        req = m.add_request("d", tokens(40), role=CacheRole.DECODE)
        with pytest.raises(ValueError, match="per-group"):
            m.receive(req)
    m = KVCacheManager(geo, 64, pd_policy="per-group", pd_role=True)
    assert m.receive(m.add_request("d", tokens(40), role=CacheRole.DECODE)) is not None


def test_eagle_recompute_sizing_leaves_room_for_the_private_copies() -> None:
    """A pool sized for one `max_model_len` request (§8) still admits it with a hit: the
    caps count the copy's source one step longer (§4), so the lone request never waits for
    blocks that do not exist."""
    from relaykv.kvcache import CacheSizing

    geo = geometry("full:16", "sliding:16:32", draft=1, reuse="recompute")
    plain = CacheSizing.build(geo.with_eagle_reuse("drop"), 1000, 68, 68)
    sizing = CacheSizing.build(geo, 1000, 68, 68)
    assert sizing.blocks_per_request == plain.blocks_per_request + 2
    m = KVCacheManager(geo, sizing.blocks_per_request + 1, max_model_len=68,
                       max_in_flight_tokens=68, retention="dense")
    prefix = tokens(48, seed=1)
    first = m.add_request("first", [*prefix, *tokens(16, seed=2)])
    assert m.admit(first, 64, must_fit=64) is not None
    m.commit(first, 64)
    m.release(first)
    sib = m.add_request("sibling", [*prefix, *tokens(20, seed=3)])
    adm = m.admit(sib, 68, must_fit=68)
    assert adm is not None and adm.start == 47 and len(sib.copies) == 2
    assert_consistent(m)
