"""The cache lifecycle contract (`kvcache/base.py`): `KVCacheManager` provides exactly it,
and nothing else of the manager is public to call (docs/design.md §10)."""

from __future__ import annotations

import inspect

from relaykv.kvcache import CacheLifecycle, CacheRole, KVCacheManager, assert_consistent

from .conftest import geometry, tokens


def _members(cls: type) -> dict[str, object]:
    return {
        name: value
        for name, value in vars(cls).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def test_the_manager_calls_are_the_contract_and_no_more() -> None:
    contract = _members(CacheLifecycle)
    methods = {n for n, v in contract.items() if not isinstance(v, property)}
    public = {n for n, v in _members(KVCacheManager).items() if callable(v)}
    assert public == methods
    for name in methods:
        assert inspect.signature(getattr(KVCacheManager, name)) == inspect.signature(
            contract[name]
        ), name


def test_the_contract_drives_a_request_and_sees_a_consistent_cache() -> None:
    cache: CacheLifecycle = KVCacheManager(geometry("full:16", "sliding:16:32"), 40)
    req = cache.add_request("a", tokens(70), role=CacheRole.COLOCATED)
    assert set(cache.requests) == {"a"}
    admission = cache.admit(req, budget=70)
    assert admission is not None and admission.start == 0
    cache.commit(req, 70, [5])
    assert cache.usage() > 0 and cache.check() == []
    assert cache.reserve(req, 71)
    cache.commit(req, 71, [6])
    cache.release(req)
    assert cache.usage() == 0.0 and not cache.requests
    assert_consistent(cache)
