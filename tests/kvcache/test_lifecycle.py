"""The request lifecycle of `KVCacheManager` (docs/design.md §10), walked as the module
docstring states it: colocated with a preemption, and a P/D pair with a shared load."""

from __future__ import annotations

from relaykv.kvcache import CacheRole, KVCacheManager, LoadState, assert_consistent

from .conftest import geometry, tokens


def test_colocated_admit_commit_preempt_release() -> None:
    m = KVCacheManager(geometry("full:16", "sliding:16:64"), 128)
    prompt = tokens(200)
    req = m.add_request("a", prompt)
    adm = m.admit(req, budget=128, lookahead=2)
    assert adm is not None and (adm.start, adm.num_tokens) == (0, 128)
    m.commit(req, 128)
    assert m.reserve(req, 200, lookahead=2)
    m.commit(req, 200, [5])  # the step sampled one token
    assert req.num_tokens == 201 and req.tables[1][0] == 0  # the window slid
    assert_consistent(m)
    m.preempt(req)
    again = m.admit(req, budget=1000)
    assert again is not None and again.start == 192  # its own cached prefix
    assert m.stats.prefix_cache_queries == 200 and m.stats.preempted_hits == 192
    m.release(req)
    assert m.pool.num_free == m.pool.num_usable and not m.requests
    assert_consistent(m)


def test_admit_refuses_without_changing_anything() -> None:
    m = KVCacheManager(geometry("full:16"), 8)
    req = m.add_request("a", tokens(300))
    assert m.admit(req, budget=300) is None
    assert req.tables == [[]] and m.pool.num_free == m.pool.num_usable
    assert m.stats.prefix_cache_queries == 0


def test_pd_receive_share_deliver_release() -> None:
    geo = geometry("full:16", "sliding:16:64")
    p = KVCacheManager(geo, 256, pd_policy="per-group", pd_role=True)
    d = KVCacheManager(geo, 256, pd_policy="per-group", pd_role=True)
    x = tokens(304)  # 19 full blocks: every block has a key, so every block can be shared
    p_req = p.add_request("p", x, role=CacheRole.PREFILL)
    assert p.admit(p_req, budget=304) is not None
    p.commit(p_req, 304)
    held = p.hold_for_transfer(p_req)

    first = d.receive(d.add_request("d1", x, role=CacheRole.DECODE))
    second = d.receive(d.add_request("d2", x, role=CacheRole.DECODE))
    assert first is not None and second is not None
    assert first.needs_transfer and not second.needs_transfer  # shares first's transfer
    assert first.transfer_pairs(held)  # P's and D's lists pair by block index
    assert not second.delivered and second.waits_on == {first}
    assert first.request.load is first and first.state is LoadState.PENDING
    delivered = d.load_finished(first, ok=True)
    assert set(delivered) == {first, second} and all(x.ok for x in delivered)
    assert first.request.load is None and second.request.load is None
    p.release(p_req)
    for load in delivered:
        assert d.reserve(load.request, 304)
        d.commit(load.request, 304)
        d.release(load.request)
    third = d.receive(d.add_request("d3", x, role=CacheRole.DECODE))
    assert third is not None and third.delivered and third.local_tokens == 303
    d.release(third.request)
    for m in (p, d):
        assert m.pool.num_free == m.pool.num_usable and not m.requests
        assert_consistent(m)


def test_release_during_transfer_waits_for_the_transport() -> None:
    geo = geometry("full:16", "sliding:16:64")
    d = KVCacheManager(geo, 256, pd_role=True)
    req = d.add_request("d", tokens(300), role=CacheRole.DECODE)
    load = d.receive(req)
    assert load is not None and load.needs_transfer
    d.release(req)
    assert load.abandoned and d.pool.num_free < d.pool.num_usable  # still being written
    assert d.load_finished(load, ok=False) == []
    assert d.pool.num_free == d.pool.num_usable and not d.requests
    assert_consistent(d)
