"""The simulated router scores engines with the router's own index and policies."""

from __future__ import annotations

import pytest

from relaykv.engine import SchedulerConfig
from relaykv.router.routing import Prompt
from relaykv.sim.cluster import ClusterSpec, SimCluster
from relaykv.sim.hardware import HARDWARE, LINKS
from relaykv.sim.model_presets import model_spec
from relaykv.sim.routing import _usable_hit
from relaykv.sim.workload import shared_prefix_dataset

MODEL = model_spec("gpt-oss-20b")


@pytest.mark.parametrize("policy", ["per-group", "exact"])
def test_shortcut_equals_the_index_lookup(policy: str) -> None:
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
    probes = [r.prompt for r in reqs] + [r.prompt[:300] + [5] * 50 for r in reqs] + [[7] * 400]
    nonzero = 0
    for name, index in cluster.router.indexes.items():
        assert index.num_blocks > 0, name  # the index follows the engine's KV events
        for tokens in probes:
            full = index.usable_hit(Prompt(tokens).request_for(index))
            assert _usable_hit(index, Prompt(tokens)) == full
            nonzero += full > 0
    assert nonzero > 0
