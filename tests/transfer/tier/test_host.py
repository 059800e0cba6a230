"""The native host tier: copies off the step thread, and the engine on tiny-hybrid with it.

With a pool far smaller than the working set, prefixes revisited come back from the tier:
more cached tokens than without it, and greedy outputs identical token for token (with the
EAGLE draft, so the full draft group's peek rule and the sliding windows both apply). The
cache's invariant checker (the tier index's included) runs after every step.
"""

from __future__ import annotations

import random
import time

import pytest
import torch

from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.kvcache import assert_consistent
from relaykv.kvcache.tier import JobKind, TierCopy, TierJob
from relaykv.transfer.tier.host import HostTier
from relaykv.transfer.tier.registry import backend_names, factory

model = pytest.importorskip("relaykv.model")


def _wait(tier: HostTier) -> list[tuple[TierJob, bool]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done = tier.poll()
        if done:
            return done
        time.sleep(0.001)
    raise AssertionError("the tier never finished the job")


def test_store_then_load_roundtrip() -> None:
    kv = torch.arange(8 * 32, dtype=torch.uint8).reshape(8, 32).clone()
    before = kv.clone()
    tier = HostTier(kv, capacity_blocks=4)
    try:
        store = TierJob(0, JobKind.STORE, (TierCopy(0, b"a", 3, 5), TierCopy(1, b"b", 0, 2)))
        tier.submit(store)
        assert _wait(tier) == [(store, True)]
        kv.zero_()
        load = TierJob(1, JobKind.LOAD, (TierCopy(0, b"a", 3, 1), TierCopy(1, b"b", 0, 7)))
        tier.submit(load)
        assert _wait(tier) == [(load, True)]
        assert torch.equal(kv[1], before[5]) and torch.equal(kv[7], before[2])
        bad = TierJob(2, JobKind.LOAD, (TierCopy(0, b"a", 9, 1),))  # no slot 9
        tier.submit(bad)
        assert _wait(tier) == [(bad, False)]
    finally:
        tier.shutdown()


def test_registry_names_native() -> None:
    assert "native" in backend_names()
    with pytest.raises(ValueError, match="unknown KV offloading backend 'nope'"):
        factory("nope")


BLOCK = 16


@pytest.fixture(scope="module")
def tiny():
    return model.load_model("tiny-hybrid")


def _engine(tiny, draft, num_blocks: int, tier_blocks: int) -> LLMEngine:
    runner = model.ModelRunner(
        tiny.model, num_blocks=num_blocks, block_size=BLOCK, draft=draft, num_speculative_tokens=2
    )
    config = EngineConfig(
        num_blocks=num_blocks,
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, max_model_len=512),
    )
    tier = HostTier(runner.kv_buffer, tier_blocks) if tier_blocks else None
    return LLMEngine(runner, config, vocab_size=tiny.config.vocab_size, tier=tier)


def _revisits(count: int, length: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[1, *(rng.randrange(3, 259) for _ in range(length - 1))] for _ in range(count)]
    visits = [(p, i) for i in range(2) for p in range(count)]
    first, second = visits[:count], visits[count:]
    rng.shuffle(second)
    return [prefixes[p] + [rng.randrange(3, 259) for _ in range(5 + i)] for p, i in first + second]


def _serve(eng: LLMEngine, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    outputs, cached = [], 0
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        req = eng.add_request(f"r{i}", p, params)
        while eng.has_unfinished():
            eng.step()
            assert_consistent(eng.manager)
        outputs.append(req.output_ids)
        if i >= len(prompts) // 2:
            cached += req.num_cached_tokens
    return outputs, cached


def test_tier_brings_revisits_back_with_identical_outputs(tiny) -> None:
    draft = model.default_draft("tiny-hybrid", tiny.config)
    prompts = _revisits(count=4, length=160)  # 4 x 20 blocks against a 40-block pool
    without, cached_without = _serve(_engine(tiny, draft, 40, 0), prompts)
    eng = _engine(tiny, draft, 40, 200)
    try:
        with_tier, cached_with = _serve(eng, prompts)
        tier = eng.manager.tier
        assert tier is not None and tier.stats.blocks_loaded > 0
    finally:
        eng.manager.tier.shutdown() if eng.manager.tier else None
    assert with_tier == without
    revisit_tokens = sum(len(p) for p in prompts[4:])
    assert cached_with >= 0.7 * revisit_tokens > cached_without
