"""A simulated run and a real run of the same tiny workload count the same hits.

At concurrency 1 timing cannot change the order of cache operations, so the real
scheduler and cache must make the same decisions in both: the real tiny-hybrid model
with an EAGLE draft on a P/D pair over shm, and the simulator with the cost model. Every
hit counter of both engines must be identical (output tokens differ, so only the prompt
KV decides hits: each prompt here is new to the engines but for its shared prefix).
"""

from __future__ import annotations

import time

import pytest

from relaykv.common.workloads import generated_shared_prefix_requests
from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.kvcache import PD_POLICIES
from relaykv.sim.cluster import ClusterSpec, SimCluster
from relaykv.sim.hardware import HARDWARE, LINKS
from relaykv.sim.model_presets import model_spec

BLOCKS, K = 200, 2
SCHED = SchedulerConfig(max_num_batched_tokens=256, max_model_len=1024)
COUNTERS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_hits",
    "kv_bytes_received",
    "kv_bytes_sent",
    "loads_coalesced",
)
PROMPTS = generated_shared_prefix_requests(
    259, num_groups=2, prompts_per_group=2, system_prompt_len=150, question_len=12, output_len=3
)


@pytest.fixture(scope="module")
def model():
    from relaykv.model import load_model, random_draft

    loaded = load_model("tiny-hybrid")
    return loaded, random_draft(loaded.config, seed=1)


def _real(model, policy: str) -> dict[str, dict[str, int]]:
    from relaykv.model import ModelRunner
    from relaykv.transfer.connector import PDConnector
    from relaykv.transfer.transport import get_transport

    loaded, draft = model
    engines = {}
    for role in ("prefill", "decode"):
        runner = ModelRunner(loaded.model, num_blocks=BLOCKS, draft=draft, num_speculative_tokens=K)
        eng = LLMEngine(
            runner,
            EngineConfig(num_blocks=BLOCKS, role=role, pd_policy=policy, scheduler=SCHED),
            vocab_size=259,
        )
        eng.attach_connector(
            PDConnector(
                role,
                eng.manager,
                get_transport("shm"),
                runner.kv.buffer,
                engine_id=f"{role}-{policy}",
            )
        )
        engines[role] = eng
    p, d = engines["prefill"], engines["decode"]
    try:
        for i, r in enumerate(PROMPTS):
            p.add_request(
                f"r{i}",
                r.prompt_ids,
                SamplingParams(max_tokens=1, temperature=0),
                kv_transfer_params={"do_remote_decode": True},
            )
            params = None
            while p.has_unfinished():
                for out in p.step():
                    params = out.kv_transfer_params or params
            d.add_request(
                f"r{i}",
                r.prompt_ids,
                SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True),
                kv_transfer_params=params,
            )
            while d.has_unfinished() or p.connector._held:
                if not d.step():
                    time.sleep(0.0005)  # leave the CPU to the transport's IO thread
                p.scheduler.settle_transfers()
        return {role: eng.manager.stats.snapshot() for role, eng in engines.items()}
    finally:
        p.connector.shutdown()
        d.connector.shutdown()


def _sim(policy: str) -> dict[str, dict[str, int]]:
    spec = ClusterSpec(
        model_spec("tiny-hybrid"),
        HARDWARE["h100"],
        LINKS["shm"],
        pd_policy=policy,
        num_speculative_tokens=K,
        num_blocks=BLOCKS,
        scheduler=SCHED,
    )
    cluster = SimCluster(spec)
    cluster.run(PROMPTS, [0.0] * len(PROMPTS), max_concurrency=1, num_warmups=0)
    assert cluster.check() == []
    return cluster.counters()


@pytest.mark.slow
@pytest.mark.parametrize("policy", PD_POLICIES)
def test_identical_hit_counters_at_concurrency_1(model, policy: str) -> None:
    real, sim = _real(model, policy), _sim(policy)
    for role in ("prefill", "decode"):
        assert {k: sim[role][k] for k in COUNTERS} == {k: real[role][k] for k in COUNTERS}, role
    if policy == "per-group":
        assert real["decode"]["prefix_cache_hits"] > 0  # the comparison is not vacuous
