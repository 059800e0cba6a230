from __future__ import annotations

import random

from relaykv.common.messages.steps import SamplingParams
from relaykv.engine.engine import EngineConfig, LLMEngine
from relaykv.engine.scheduler import SchedulerConfig
from relaykv.kvcache import Geometry, GroupSpec, assert_consistent

from .reference_executor import ReferenceExecutor

HYBRID = Geometry((GroupSpec("full", 4), GroupSpec("sliding", 4, window=10)))
HYBRID_DRAFT = Geometry((GroupSpec("full", 4, draft=True), GroupSpec("sliding", 4, window=10)))


def make_engine(
    geometry: Geometry = HYBRID,
    num_blocks: int = 400,
    k: int = 0,
    budget: int = 64,
    max_seqs: int = 16,
    max_model_len: int = 512,
    **kw,
) -> LLMEngine:
    config = EngineConfig(
        num_blocks=num_blocks,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len
        ),
        **kw,
    )
    return LLMEngine(ReferenceExecutor(geometry, num_blocks, k=k), config, vocab_size=101)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(101) for _ in range(n)]


def drain(engine: LLMEngine) -> None:
    while engine.has_unfinished():
        engine.step()
        assert_consistent(engine.manager)
        assert engine.scheduler.check() == []
