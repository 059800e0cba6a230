"""The engine on the real tiny-hybrid model (the reference-executor tests, for real).

Reference: the model layer's own offline driver (`tests.model.offline.OfflineGenerator`:
private blocks, no prefix cache, no preemption, no window freeing) run on each prompt
alone. Greedy outputs of the engine - batched, chunked, cached, preempted, speculative - must
equal it token for token. Kept small: tiny-hybrid runs at CPU speed.
"""

from __future__ import annotations

import random

import pytest

from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.kvcache import assert_consistent

model = pytest.importorskip("relaykv.model")

BLOCK = 16


@pytest.fixture(scope="module")
def tiny():
    return model.load_model("tiny-hybrid")


@pytest.fixture(scope="module")
def draft(tiny):
    return model.default_draft("tiny-hybrid", tiny.config)


_ALONE: dict[tuple[int, tuple[int, ...], int], list[int]] = {}


def alone(tiny, prompt: list[int], max_tokens: int) -> list[int]:
    """The reference output, computed once per (model, prompt, max_tokens): the k=0 and k=2
    cases share their prompts, and the offline driver runs at tiny-hybrid's CPU speed."""
    from tests.model.offline import OfflineGenerator

    key = (id(tiny.model), tuple(prompt), max_tokens)
    if key not in _ALONE:
        runner = model.ModelRunner(tiny.model, num_blocks=64, block_size=BLOCK)
        _ALONE[key] = OfflineGenerator(runner).generate([prompt], max_tokens)[0].output_ids
    return list(_ALONE[key])


def engine(
    tiny,
    num_blocks: int,
    *,
    k: int = 0,
    draft=None,
    budget: int = 48,
    max_model_len: int = 512,
    **config_fields,
) -> LLMEngine:
    runner = model.ModelRunner(
        tiny.model,
        num_blocks=num_blocks,
        block_size=BLOCK,
        draft=draft,
        num_speculative_tokens=k,
    )
    config = EngineConfig(
        num_blocks=num_blocks,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=max_model_len
        ),
        **config_fields,
    )
    return LLMEngine(runner, config, vocab_size=tiny.config.vocab_size)


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [1, *(rng.randrange(3, 259) for _ in range(n - 1))]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def run(eng: LLMEngine, prompts: list[list[int]], max_tokens: list[int], tag: str):
    reqs = [
        eng.add_request(f"{tag}{i}", p, greedy(m))
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]
    while eng.has_unfinished():
        eng.step()
    assert_consistent(eng.manager)
    return reqs


@pytest.mark.parametrize("k", [0, 2])
def test_concurrent_mixed_lengths_equal_each_alone(tiny, draft, k: int) -> None:
    prompts = [prompt(n, seed=n) for n in (5, 41, 97, 18, 130)]
    max_tokens = [7, 4, 6, 9, 5]
    expected = [alone(tiny, p, m) for p, m in zip(prompts, max_tokens, strict=True)]
    eng = engine(tiny, 200, k=k, draft=draft if k else None)
    reqs = run(eng, prompts, max_tokens, "r")
    assert [r.output_ids for r in reqs] == expected
    pool = eng.manager.pool
    assert pool.num_free == pool.num_usable
    if k:
        assert eng.metrics.spec_num_draft_tokens > 0


def test_shared_long_prefix_reports_cached_tokens(tiny) -> None:
    x = prompt(100, seed=7)
    eng = engine(tiny, 200)  # budget 48: the prompt is prefilled in chunks
    (first,) = run(eng, [[*x, 11, 12]], [3], "f")
    assert first.num_cached_tokens == 0
    # The first prompt's replay boundary 96 (= floor(101/16)*16) is kept in every group -
    # its sliding window (W=64) spans three prefill chunks - so a sibling that diverges at
    # 100 resumes at 96 (docs/design.md §6), and so does an identical resend.
    (second,) = run(eng, [[*x, 21, 22]], [5], "s")
    assert second.num_cached_tokens == 96
    assert second.output_ids == alone(tiny, [*x, 21, 22], 5)
    (resend,) = run(eng, [[*x, 21, 22]], [5], "r")
    assert resend.num_cached_tokens == 96 and resend.output_ids == second.output_ids
    stats = eng.manager.stats
    assert stats.prefix_cache_hits == 192 and stats.prefix_cache_queries == 102 * 3


def test_forced_preemption_keeps_outputs_and_leaks_nothing(tiny) -> None:
    prompts = [prompt(n, seed=100 + n) for n in (40, 47, 54, 33)]
    max_tokens = [60, 56, 50, 64]
    expected = [alone(tiny, p, m) for p, m in zip(prompts, max_tokens, strict=True)]
    eng = engine(tiny, 36, budget=32, max_model_len=192)
    reqs = run(eng, prompts, max_tokens, "p")
    assert eng.scheduler.num_preemptions > 0
    assert [r.output_ids for r in reqs] == expected
    assert eng.manager.pool.num_free == eng.manager.pool.num_usable
    assert not eng.manager.requests



def _cached_pages(eng: LLMEngine) -> dict[tuple[int, int], bytes]:
    """The page bytes of every block the cache holds a key for, by (group, block)."""
    kv = eng.executor.kv
    return {
        (g, block): kv.read_page_bytes(g, [block]).numpy().tobytes()
        for g, gmap in enumerate(eng.manager.pool.maps)
        for block in gmap.values()
    }


def _one_by_one(eng: LLMEngine, prompts, max_tokens, tag: str):
    """Run the prompts one after the other; per request (request, accepted, proposed)."""
    out = []
    for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True)):
        accepted, proposed = eng.metrics.spec_num_accepted_tokens, eng.metrics.spec_num_draft_tokens
        (req,) = run(eng, [p], [m], f"{tag}{i}")
        out.append((
            req,
            eng.metrics.spec_num_accepted_tokens - accepted,
            eng.metrics.spec_num_draft_tokens - proposed,
        ))
    return out


@pytest.mark.parametrize("budget", [48, 8])  # 8: the copies' step is one chunk of several
def test_eagle_recompute_reuses_the_whole_shared_prefix(tiny, draft, budget: int) -> None:
    """`eagle_reuse=recompute` (docs/design.md §4): siblings of a 96-token prefix resume at
    96 instead of 80 and compute position 95 again, into private copies of its blocks.
    Outputs equal plain decoding (no draft), each sibling's draft acceptance equals a run
    without any prefix cache, no block the cache holds a key for is written, none leaks."""
    x = prompt(96, seed=21)
    prompts = [[*x, *prompt(20, seed=30 + i)[1:]] for i in range(3)]  # 115 tokens each
    max_tokens = [12, 9, 14]
    expected = [alone(tiny, p, m) for p, m in zip(prompts, max_tokens, strict=True)]
    cold = _one_by_one(
        engine(tiny, 240, k=2, draft=draft, enable_prefix_caching=False), prompts, max_tokens, "c"
    )
    assert [req.output_ids for req, _, _ in cold] == expected
    computed = {}
    for mode in ("drop", "recompute"):
        eng = engine(
            tiny, 240, k=2, draft=draft, budget=budget, eagle_reuse=mode, retention="dense"
        )
        runs = _one_by_one(eng, prompts[:1], max_tokens[:1], "f")
        pages = _cached_pages(eng)
        runs += _one_by_one(eng, prompts[1:], max_tokens[1:], "s")
        assert [req.output_ids for req, _, _ in runs] == expected
        after = _cached_pages(eng)
        assert {key: after.get(key) for key in pages} == pages  # shared blocks unchanged
        computed[mode] = [req.num_prompt_tokens - req.num_cached_tokens for req, _, _ in runs]
        pool = eng.manager.pool
        assert pool.num_free == pool.num_usable and not eng.manager.requests
        if mode == "recompute":  # acceptance unchanged, sibling by sibling
            assert [run[1:] for run in runs] == [run[1:] for run in cold]
    # drop: 115 - 80 (the last shared unit dropped); recompute: 115 - 95 (position 95 again)
    assert computed == {"drop": [115, 35, 35], "recompute": [115, 20, 20]}
