"""Retention keeps what later lookups land on, however the prompt was chunked (§6)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relaykv.kvcache import KVCacheManager

from .conftest import Driver, tokens
from .strategies import geometries


def _hits(geo, retention: str, prompt: list[int], chunk: int) -> tuple[int, int]:
    m = KVCacheManager(geo, 4096, retention=retention)
    d = Driver(m)
    req, _ = d.prefill(prompt, chunk=chunk)
    d.decode(req, 3)
    d.finish(req)
    resend = m.lookup(m.add_request("resend", prompt)).tokens
    extension = m.lookup(m.add_request("extension", [*prompt, 999, 998, 997])).tokens
    return resend, extension


@settings(max_examples=200, deadline=None)
@given(geometries(max_groups=3), st.integers(2, 200), st.integers(1, 64), st.integers(1, 64))
def test_boundaries_retention_loses_no_resend_or_extension_hit(geo, n, chunk, dense_chunk) -> None:
    """With no eviction, keeping only the replay-boundary windows gives the same resend and
    extension hits as keeping every block, whatever the chunking of the first prefill."""
    prompt = tokens(n, seed=n)
    assert _hits(geo, "boundaries", prompt, chunk) == _hits(geo, "dense", prompt, dense_chunk)
