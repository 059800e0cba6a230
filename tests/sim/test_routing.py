"""The simulated router's indexes follow the engines' KV events, as the router's do."""

from __future__ import annotations

import pytest

from relaykv.common.workloads import generated_shared_prefix_requests
from relaykv.engine import SchedulerConfig
from relaykv.router.prompt import Prompt
from relaykv.sim.cluster import ClusterSpec, SimCluster
from relaykv.sim.hardware import HARDWARE, LINKS
from relaykv.sim.model_presets import model_spec

MODEL = model_spec("gpt-oss-20b")


@pytest.mark.parametrize("policy", ["per-group", "exact"])
def test_indexes_follow_the_engines(policy: str) -> None:
    reqs = generated_shared_prefix_requests(
        MODEL.vocab_size,
        num_groups=3,
        prompts_per_group=3,
        system_prompt_len=700,
        question_len=40,
        output_len=4,
    )
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
        hits = [index.usable_hit(Prompt(r.prompt_ids).request_for(index)) for r in reqs]
        bounds = [index.hit_bound(Prompt(r.prompt_ids).request_for(index)) for r in reqs]
        assert all(b >= h for b, h in zip(bounds, hits, strict=True))
        assert any(hits), name  # every engine served some prefix it still holds
