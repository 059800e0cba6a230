"""Engine behaviour against the paging-sensitive reference executor (greedy, exact)."""

from __future__ import annotations

import pytest

from relaykv.common.messages.steps import InvalidRequest, SamplingParams
from relaykv.kvcache import assert_consistent

from .conftest import HYBRID, HYBRID_DRAFT, drain, greedy, make_engine, prompt
from .reference_executor import reference_generate


def _run_all(engine, prompts, max_tokens):
    reqs = [
        engine.add_request(f"r{i}", p, greedy(m))
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=False))
    ]
    drain(engine)
    return reqs


@pytest.mark.parametrize("k", [0, 3])
def test_concurrent_mixed_lengths_match_requests_alone(k: int) -> None:
    geo = HYBRID_DRAFT if k else HYBRID
    engine = make_engine(geo, k=k, budget=48)
    prompts = [prompt(n, seed=n) for n in (5, 37, 120, 64, 9, 200, 3, 81)]
    max_tokens = [20, 7, 33, 1, 50, 12, 25, 40]
    reqs = _run_all(engine, prompts, max_tokens)
    for req, p, m in zip(reqs, prompts, max_tokens, strict=True):
        assert req.output_ids == reference_generate(geo, p, m), req.request_id
        assert req.finish_reason.value == "length"
    assert engine.manager.pool.num_free == engine.manager.pool.num_usable
    if k:
        assert engine.metrics.spec_num_accepted_tokens > 0
        assert engine.metrics.spec_num_draft_tokens > engine.metrics.spec_num_accepted_tokens


def test_shared_prefix_reports_cached_tokens() -> None:
    engine = make_engine()
    x = prompt(100, seed=1)
    first = engine.add_request("a", x + [1] * 9, greedy(4))
    drain(engine)
    second = engine.add_request("b", x + [9] * 9, greedy(4))
    drain(engine)
    assert first.num_cached_tokens == 0
    # The sliding window at the junction was never kept (boundaries retention) ...
    assert second.num_cached_tokens == 0
    third = engine.add_request("c", [*x, 5, 5], greedy(4))
    drain(engine)
    # ... but the second request pinned it, so the third sibling hits all of x (§6).
    assert third.num_cached_tokens == 100
    assert third.output_ids == reference_generate(HYBRID, [*x, 5, 5], 4)
    resend = engine.add_request("d", [*x, 5, 5], greedy(4))
    drain(engine)
    assert resend.num_cached_tokens == 100 and resend.output_ids == third.output_ids
    stats = engine.manager.stats
    assert stats.prefix_cache_hits == 200 and stats.prefix_cache_queries == 109 * 2 + 102 * 2


@pytest.mark.parametrize("k", [0, 2])
def test_preemption_in_a_tiny_pool_keeps_outputs_and_leaks_nothing(k: int) -> None:
    geo = HYBRID_DRAFT if k else HYBRID
    engine = make_engine(geo, num_blocks=70, k=k, budget=32, max_model_len=256)
    prompts = [prompt(60 + 7 * i, seed=i) for i in range(6)]
    reqs = _run_all(engine, prompts, [40] * 6)
    assert engine.scheduler.num_preemptions > 0
    for req, p in zip(reqs, prompts, strict=True):
        assert req.output_ids == reference_generate(geo, p, 40)
    assert engine.manager.pool.num_free == engine.manager.pool.num_usable
    assert not engine.manager.requests
    assert_consistent(engine.manager)


def test_abort_frees_blocks() -> None:
    engine = make_engine()
    engine.add_request("a", prompt(150, 3), greedy(100))
    engine.add_request("b", prompt(20, 4), greedy(100))
    for _ in range(5):
        engine.step()
    assert engine.abort("a")
    outs = engine.step()
    assert any(o.request_id == "a" and o.finished and o.finish_reason == "abort" for o in outs)
    assert not engine.abort("a")
    assert engine.abort("b")
    drain(engine)
    assert engine.manager.pool.num_free == engine.manager.pool.num_usable


def test_stop_tokens_min_tokens_and_eos() -> None:
    p = prompt(30, 5)
    full = reference_generate(HYBRID, p, 30)
    stop_at = full[5]
    first = full.index(stop_at)
    engine = make_engine()
    req = engine.add_request(
        "a", p, SamplingParams(max_tokens=30, temperature=0, stop_token_ids=(stop_at,))
    )
    drain(engine)
    assert req.output_ids == full[: first + 1] and req.finish_reason.value == "stop"
    assert req.stop_reason == stop_at
    engine = make_engine()
    engine.eos_token_ids = frozenset({stop_at})
    engine.scheduler.eos_token_ids = engine.eos_token_ids
    req = engine.add_request(
        "b", p, SamplingParams(max_tokens=30, temperature=0, min_tokens=first + 2)
    )
    drain(engine)
    later = full.index(stop_at, first + 1) if stop_at in full[first + 1 :] else None
    if later is not None and later + 1 <= 30:
        assert req.output_ids == full[: later + 1]
    else:
        assert req.output_ids == full


class CharTokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_stop_strings_cut_the_text() -> None:
    engine = make_engine()
    engine.tokenizer = CharTokenizer()
    p = prompt(40, 6)
    full_text = CharTokenizer().decode(reference_generate(HYBRID, p, 40))
    stop = full_text[10:12]
    req = engine.add_request("a", p, SamplingParams(max_tokens=40, temperature=0, stop=(stop,)))
    texts = []
    while engine.has_unfinished():
        texts.extend(o.new_text for o in engine.step() if o.request_id == "a")
    cut = full_text.find(stop)
    assert req.text == full_text[:cut] == "".join(texts)
    assert req.finish_reason.value == "stop" and req.stop_reason == stop


@pytest.mark.parametrize(
    ("prompt_ids", "params", "field"),
    [
        ([], dict(max_tokens=4), "prompt"),
        ([1, 2, 500], dict(max_tokens=4), "prompt"),
        ([1, -2], dict(max_tokens=4), "prompt"),
        ([1] * 600, dict(max_tokens=4), "prompt"),
        ([1] * 500, dict(max_tokens=40), "max_tokens"),
        ([1], dict(max_tokens=0), "max_tokens"),
        ([1], dict(top_p=0), "top_p"),
        ([1], dict(temperature=-1), "temperature"),
        ([1], dict(temperature=float("inf")), "temperature"),
        ([1], dict(top_p=float("nan")), "top_p"),
        ([1], dict(top_k=10**9), "top_k"),
        ([1], dict(seed=1 << 64), "seed"),
        ([1], dict(seed=-(1 << 63) - 1), "seed"),
        ([1], dict(stop=("x",)), "stop"),
    ],
)
def test_invalid_requests_change_nothing(prompt_ids, params, field) -> None:
    """Refused at construction (no model needed) or by the engine, always naming the field."""
    engine = make_engine()
    with pytest.raises(InvalidRequest) as err:
        engine.add_request("bad", prompt_ids, SamplingParams(**{"temperature": 0.0, **params}))
    assert err.value.field == field
    assert not engine.has_unfinished() and not engine.manager.requests


def test_duplicate_request_id() -> None:
    engine = make_engine()
    engine.add_request("a", [1, 2], greedy(2))
    with pytest.raises(InvalidRequest):
        engine.add_request("a", [1, 2], greedy(2))
