"""Retention keeps what later lookups land on, however the prompt was chunked (§6)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaykv.kvcache import KVCacheManager, Retention, Role, parse_retention

from .conftest import Driver, geometry, tokens
from .strategies import ALL_MODES, geometries


def _hits(geo, retention: str, prompt: list[int], chunk: int) -> tuple[int, int]:
    # 512 blocks hold every block of a 200-token prompt and its decode at the smallest block
    # size (2) in each of 3 groups: no eviction (checked). A bigger pool only makes each
    # step's invariant check (linear in the pool) slower.
    m = KVCacheManager(geo, 512, retention=retention)
    d = Driver(m)
    req, _ = d.prefill(prompt, chunk=chunk)
    d.decode(req, 3)
    d.finish(req)
    assert m.pool.evictions == 0
    resend = m._lookup(m.add_request("resend", prompt)).tokens
    extension = m._lookup(m.add_request("extension", [*prompt, 999, 998, 997])).tokens
    return resend, extension


@settings(max_examples=200, deadline=None)
@given(
    geometries(max_groups=3, modes=ALL_MODES),
    st.integers(2, 200),
    st.integers(1, 64),
    st.integers(1, 64),
)
def test_boundaries_retention_loses_no_resend_or_extension_hit(geo, n, chunk, dense_chunk) -> None:
    """With no eviction, keeping only the replay-boundary windows gives the same resend and
    extension hits as keeping every block, whatever the chunking of the first prefill."""
    prompt = tokens(n, seed=n)
    assert _hits(geo, "boundaries", prompt, chunk) == _hits(geo, "dense", prompt, dense_chunk)


def test_auto_is_dense_on_a_prefill_engine_and_boundaries_elsewhere() -> None:
    assert parse_retention("auto", 16, Role.PREFILL) == Retention("dense")
    for role in (Role.COLOCATED, Role.DECODE):
        assert parse_retention("auto", 16, role) == Retention("boundaries")
    with pytest.raises(ValueError, match="retention"):
        parse_retention("auto", 16)  # an engine role is needed to resolve it


def test_dense_serves_the_second_sibling_boundaries_only_the_third() -> None:
    # Why a prefill engine defaults to dense (docs/design.md §6): the first request of a
    # prefix cannot know where its siblings diverge.
    geo = geometry("full:16", "sliding:16:32", draft=0)
    system = tokens(200, seed=1)
    for retention, second_hits in (("dense", True), ("boundaries", False)):
        m = KVCacheManager(geo, 4096, retention=retention)
        d = Driver(m)
        hits = []
        for i in range(3):
            req, hit = d.prefill(system + tokens(20, seed=10 + i), chunk=64)
            d.finish(req)
            hits.append(hit)
        assert hits[0] == 0 and hits[2] > 0
        assert (hits[1] > 0) is second_hits, (retention, hits)
