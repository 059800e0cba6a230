"""Sizing and admission (docs/design.md §8): one cap at startup and at run time."""

from __future__ import annotations

from relaykv.kvcache import CacheSizing, Geometry, GroupSpec, KVCacheManager, pd_slack_tokens

from .conftest import Driver, geometry, tokens


def test_sliding_cap_matches_the_formula() -> None:
    geo = Geometry((GroupSpec("sliding", 16, window=1024),))
    assert CacheSizing.build(geo, 1000, 16384, 1024).caps == (129,)
    assert CacheSizing.build(geo, 1000, 16384, 2048).caps == (193,)


def test_max_concurrency_of_a_hybrid() -> None:
    geo = Geometry((GroupSpec("full", 16), GroupSpec("sliding", 16, window=1024)))
    sizing = CacheSizing.build(geo, (1024 + 129) * 3 + 1, 16384, 1024)
    assert sizing.caps == (1024, 129)
    assert sizing.max_concurrency == 3.0
    assert sizing.fits_at_startup()


def test_pd_slack_counts_in_the_caps() -> None:
    geo = geometry("full:16", "sliding:16:128", draft=1)
    plain = CacheSizing.build(geo, 1000, 4096, 256)
    exact = CacheSizing.build(geo, 1000, 4096, 256, pd_policy="exact")
    slack = pd_slack_tokens(geo, "exact")[1]
    assert exact.caps[1] == -(-(127 + slack + 256) // 16) + 1 > plain.caps[1]


def test_memory_sizing() -> None:
    geo = Geometry(
        (
            GroupSpec("full", 16, bytes_per_token=64),
            GroupSpec("sliding", 16, window=8, bytes_per_token=32),
        )
    )
    assert geo.block_bytes == 1024
    assert CacheSizing.blocks_for_memory(geo, 1 << 20) == 1024


def test_min_reusable_prefix_includes_the_eagle_unit() -> None:
    assert CacheSizing.build(geometry("full:16"), 10, 100, 16).min_reusable_prefix == 17
    assert CacheSizing.build(geometry("full:16", draft=0), 10, 100, 16).min_reusable_prefix == 32


def test_what_startup_admits_runtime_admits() -> None:
    """A pool sized for k requests of max_model_len admits k of them at run time (§8)."""
    geo = geometry("full:16", "sliding:16:32")
    per_request = CacheSizing.build(geo, 10, 256, 64).blocks_per_request
    m = KVCacheManager(geo, 3 * per_request + 1, max_model_len=256, max_in_flight_tokens=64)
    assert m.sizing.max_concurrency == 3.0
    d = Driver(m)
    reqs = []
    for seed in range(3):
        req = d.new(tokens(256, seed=seed))
        assert m._allocate(req, 64, must_fit=256)
        reqs.append(req)
    # Each runs to max_model_len in chunks of 64 without ever failing to allocate.
    for end in range(128, 257, 64):
        for req in reqs:
            assert m._allocate(req, end)
            m._cache(req, end)
            m._free_skipped(req, end)
