"""P/D end to end without a model: two engines, a real transport, the reference executor.

Output must equal a colocated run token for token (greedy), for every policy and transport,
and both pools must return to empty.
"""

from __future__ import annotations

import pytest

from relaykv.kvcache import PD_POLICIES, Geometry, GroupSpec
from relaykv.transfer.transport import availability

from ..engine.reference_executor import reference_generate
from .pd_pair import PDPair

GEO = Geometry((GroupSpec("full", 4, draft=True), GroupSpec("sliding", 4, window=12)))
TRANSPORTS = [t for t, why in availability().items() if why is None]


def _prompt(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(101) for _ in range(n)]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("policy", PD_POLICIES)
def test_pd_output_equals_colocated(policy: str, transport: str) -> None:
    pair = PDPair(GEO, policy, transport)
    try:
        prompts = [_prompt(n, seed=n) for n in (7, 40, 97, 130)]
        # Twice: the second round lets D reuse its own cache where the policy allows.
        for round_ in ("first", "again"):
            for i, p in enumerate(prompts):
                params = pair.prefill(f"{round_}{i}", p)
                pair.decode(f"{round_}{i}", p, params, 12)
            outs = pair.run()
            for i, p in enumerate(prompts):
                assert outs[f"{round_}{i}"] == reference_generate(GEO, p, 12), (round_, i)
            for eng in (pair.p, pair.d):
                assert eng.manager.pool.num_free == eng.manager.pool.num_usable
                assert not eng.manager.requests
    finally:
        pair.close()


def test_decode_engine_times_its_kv_loads() -> None:
    """`EngineMetrics.kv_transfer` (relaykv:kv_transfer_seconds) gets one sample per load
    that moved bytes, on the decode engine only."""
    pair = PDPair(GEO, "per-group", TRANSPORTS[0])
    try:
        prompts = [_prompt(n, seed=n) for n in (40, 97)]
        for i, p in enumerate(prompts):
            pair.decode(f"r{i}", p, pair.prefill(f"r{i}", p), 4)
        pair.run()
        timed = pair.d.metrics.kv_transfer
        assert timed.count == 2 and timed.total > 0
        assert pair.p.metrics.kv_transfer.count == 0
        assert pair.d.manager.stats.kv_bytes_received > 0
    finally:
        pair.close()
