"""The simulated router's indexes follow the engines' KV events, as the router's do."""

from __future__ import annotations

import pytest

from relaykv.engine import SchedulerConfig
from relaykv.router.prompt import Prompt
from relaykv.sim.cluster import ClusterSpec, SimCluster
from relaykv.sim.hardware import HARDWARE, LINKS
from relaykv.sim.model_presets import model_spec
from relaykv.sim.workload import shared_prefix_dataset

MODEL = model_spec("gpt-oss-20b")


@pytest.mark.parametrize("policy", ["per-group", "exact"])
def test_indexes_follow_the_engines(policy: str) -> None:
    reqs = shared_prefix_dataset(MODEL.vocab_size, 3, 3, 700, 40, 4, 1.0, 42, True)
    spec = ClusterSpec(
        MODEL,
        HARDWARE["h100"],
        LINKS["rdma"],
        pd_policy=policy,
        num_prefill=2,
        num_decode=2,
        num_speculative_tokens=3,
        num_blocks=3000,
        scheduler=SchedulerConfig(max_num_batched_tokens=1024, max_model_len=2048),
    )
    cluster = SimCluster(spec)
    cluster.run(reqs, [0.0] * len(reqs), max_concurrency=2, num_warmups=0)
    for name, index in cluster.router.indexes.items():
        engine = cluster.engines[name]
        # The index holds exactly the keys the engine's pool can still serve.
        for rule in engine.manager.rules:
            held = {k for k in engine.manager.pool.block_key if k is not None}
            assert set(index.maps[rule.index]) <= held
        hits = [index.usable_hit(Prompt(r.prompt).request_for(index)) for r in reqs]
        bounds = [index.hit_bound(Prompt(r.prompt).request_for(index)) for r in reqs]
        assert all(b >= h for b, h in zip(bounds, hits, strict=True))
        assert any(hits), name  # every engine served some prefix it still holds
