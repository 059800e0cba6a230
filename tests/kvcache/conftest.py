"""Shared helpers for the cache tests: geometries and a model-free engine driver."""

from __future__ import annotations

import random

import pytest

from relaykv.cache_probe.oracle import oracle_hit
from relaykv.kvcache import (
    CacheRequest,
    CacheRole,
    Geometry,
    GroupSpec,
    KVCacheManager,
    assert_consistent,
)


def geometry(*groups: str, draft: int | None = None, reuse: str = "drop") -> Geometry:
    """`geometry("full:16", "sliding:16:128", draft=1)`."""
    specs = []
    for i, text in enumerate(groups):
        kind, *nums = text.split(":")
        window = int(nums[1]) if kind == "sliding" else None
        specs.append(GroupSpec(kind, int(nums[0]), window=window, draft=(i == draft)))
    return Geometry(tuple(specs), eagle_reuse=reuse)


def tokens(n: int, seed: int = 0, vocab: int = 1000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


class Driver:
    """Runs requests through a manager like the scheduler does (no model)."""

    def __init__(self, manager: KVCacheManager, check: bool = True) -> None:
        self.m = manager
        self.check = check
        self.n = 0

    def new(
        self, prompt: list[int], role: CacheRole = CacheRole.COLOCATED, salt=None
    ) -> CacheRequest:
        self.n += 1
        return self.m.add_request(f"r{self.n}", prompt, salt=salt, role=role)

    def prefill(
        self, prompt: list[int], role=CacheRole.COLOCATED, salt=None, chunk: int | None = None
    ):
        req = self.new(prompt, role, salt)
        hit = self.m._lookup(req)
        cap = self.m._prefill_hit_cap(req) if role is CacheRole.PREFILL else None
        assert hit.tokens == oracle_hit(req, self.m.rules, self.m.pool, cap)
        assert self.m._allocate(req, hit.tokens, hit=hit) or hit.tokens == 0
        pos = hit.tokens
        chunk = chunk or len(prompt)
        while pos < len(prompt):
            end = min(len(prompt), pos + chunk)
            assert self.m._allocate(req, end, hit=None if any(req.tables) else hit)
            self.m._cache(req, end)
            self.m._free_skipped(req, end)
            pos = end
            self._check()
        return req, hit.tokens

    def decode(self, req: CacheRequest, steps: int = 1) -> None:
        for _ in range(steps):
            req.append_tokens([7])
            n = req.num_tokens
            assert self.m._allocate(req, n)
            self.m._cache(req, n)
            self.m._free_skipped(req, n)
        self._check()

    def finish(self, req: CacheRequest) -> None:
        self.m.release(req)
        self._check()

    def _check(self) -> None:
        if self.check:
            assert_consistent(self.m)


@pytest.fixture
def worked_example() -> Geometry:
    """docs/design.md §7: full(b=16) + sliding(b=16, W=128), draft in the sliding group."""
    return geometry("full:16", "sliding:16:128", draft=1)
