"""P/D on the real tiny-hybrid model (with an EAGLE draft), in one process: the decode
engine's tokens equal a colocated engine's, for every policy and transport (greedy)."""

from __future__ import annotations

import random

import pytest

from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.kvcache import PD_POLICIES, assert_consistent
from relaykv.model import ModelRunner, load_model, random_draft
from relaykv.transfer.connector import PDConnector
from relaykv.transfer.transport import get_transport

BLOCKS = 160
K = 2


@pytest.fixture(scope="module")
def model():
    loaded = load_model("tiny-hybrid")
    return loaded, random_draft(loaded.config, seed=1)


def _engine(model, role: str, policy: str, eagle_reuse: str = "drop") -> LLMEngine:
    loaded, draft = model
    runner = ModelRunner(loaded.model, num_blocks=BLOCKS, draft=draft, num_speculative_tokens=K)
    config = EngineConfig(
        num_blocks=BLOCKS, role=role, pd_policy=policy, eagle_reuse=eagle_reuse,
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_model_len=1024),
    )
    return LLMEngine(runner, config, vocab_size=loaded.config.vocab_size)


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    x = [rng.randrange(1, 250) for _ in range(150)]
    first, sibling = x + [rng.randrange(1, 250) for _ in range(3)], x + [7] * 40
    return [first, sibling, first, x[:90]]  # a resend, and a prefix of the shared part


@pytest.fixture(scope="module")
def colocated(model) -> list[list[int]]:
    engine = _engine(model, "colocated", "per-group")
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    return [r.output_ids for r in engine.generate(_prompts(), params)]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("policy", PD_POLICIES)
def test_pd_matches_colocated(model, colocated, policy: str, transport: str) -> None:
    _pd_run(model, colocated, policy, transport)


def test_pd_per_group_with_eagle_recompute_matches_colocated(model, colocated) -> None:
    """`eagle_reuse=recompute` on both engines (docs/design.md §4): P's own hits and D's local
    requests compute a hit's last position again; the tokens still equal a colocated engine's
    under the default rule, and no block leaks on either side."""
    _pd_run(model, colocated, "per-group", "shm", "recompute")


def _pd_run(
    model, colocated, policy: str, transport: str, eagle_reuse: str = "drop"
) -> None:
    p = _engine(model, "prefill", policy, eagle_reuse)
    d = _engine(model, "decode", policy, eagle_reuse)
    t = get_transport(transport)
    p.attach_connector(PDConnector("prefill", p.manager, t, p.executor.kv_buffer, engine_id="P"))
    d.attach_connector(PDConnector("decode", d.manager, t, d.executor.kv_buffer, engine_id="D"))
    try:
        outs: dict[str, list[int]] = {}
        for i, prompt in enumerate(_prompts()):
            p.add_request(f"r{i}", prompt, SamplingParams(max_tokens=1, temperature=0),
                          kv_transfer_params={"do_remote_decode": True})
            transfer = None
            while p.has_unfinished():
                for out in p.step():
                    transfer = out.kv_transfer_params or transfer
            d.add_request(f"r{i}", prompt, SamplingParams(max_tokens=10, temperature=0,
                                                          ignore_eos=True),
                          kv_transfer_params=transfer)
            # Serially: later prompts share x with earlier ones, so D reuses its own cache.
            while d.has_unfinished() or p.connector._held:
                for out in d.step():
                    outs.setdefault(out.request_id, []).extend(out.new_token_ids)
                p.scheduler.settle_transfers()
        assert [outs[f"r{i}"] for i in range(4)] == colocated
        for eng in (p, d):
            assert_consistent(eng.manager)
            assert eng.manager.pool.num_free == eng.manager.pool.num_usable
        # tiny-hybrid's draft sits in the full group: the published fix cannot help (§7).
        hits = d.manager.stats.prefix_cache_hits
        assert (hits > 0) == (policy in ("exact", "per-group")), hits
        if eagle_reuse == "recompute":
            # A local request on D (conditional disaggregation): the sibling again, from D's
            # own cache, resuming one position below its hit (the private copies, §4).
            params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
            (local,) = d.generate([_prompts()[1]], params)
            assert local.output_ids == colocated[1]
            assert 0 < local.num_cached_tokens < len(_prompts()[1]) - 1
            assert local.num_cached_tokens % 16 == 15
            assert_consistent(d.manager)
            assert d.manager.pool.num_free == d.manager.pool.num_usable
    finally:
        p.connector.shutdown()
        d.connector.shutdown()
