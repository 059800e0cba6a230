"""Speculative decoding: greedy output unchanged, sampling distribution preserved."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from relaykv.model import GREEDY, ModelRunner, SamplingParams, SequenceWork, StepBatch, random_draft
from relaykv.model.sampling import probabilities
from tests.model.offline import OfflineGenerator

from .conftest import TableMaker, random_tokens

PROMPTS = [random_tokens(n, 259, seed=20 + n) for n in (5, 40, 70, 129)]


def _plain(tiny, max_tokens=40):
    runner = ModelRunner(tiny.model, num_blocks=200)
    return [r.output_ids for r in OfflineGenerator(runner).generate(PROMPTS, max_tokens)]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculation_equals_plain_decoding(tiny, tiny_draft, k):
    runner = ModelRunner(tiny.model, num_blocks=400, draft=tiny_draft, num_speculative_tokens=k)
    results = OfflineGenerator(runner, chunk_tokens=48).generate(PROMPTS, 40)
    assert [r.output_ids for r in results] == _plain(tiny)
    stats = runner.stats
    assert stats.num_draft_tokens == sum(r.num_draft_tokens for r in results) > 0
    assert stats.num_accepted_tokens == sum(r.num_accepted_tokens for r in results)
    # the distilled tiny-hybrid draft is useful, not just harmless
    assert stats.acceptance_rate > 0.2


@pytest.mark.parametrize("window", [None, 32])
def test_random_draft_full_or_sliding_keeps_greedy_output(tiny, window):
    draft = random_draft(tiny.config, seed=3, window=window)
    runner = ModelRunner(tiny.model, num_blocks=400, draft=draft, num_speculative_tokens=2)
    slot = runner.layout.draft_slot
    group = runner.geometry.groups[slot.group]
    assert group.draft and group.window == window
    results = OfflineGenerator(runner, chunk_tokens=30).generate(PROMPTS, 24)
    assert [r.output_ids for r in results] == _plain(tiny, 24)


def test_engine_drafts_are_verified_exactly(tiny):
    """No draft model: the engine proposes; accepted prefix and correction are exact."""
    truth = _plain(tiny, 12)[1]
    prompt = PROMPTS[1]
    for wrong_at in (0, 2, 4, None):
        runner = ModelRunner(tiny.model, num_blocks=64)
        tables = TableMaker(runner).fresh(len(prompt) + 12)
        drafts = list(truth[1:6])
        if wrong_at is not None:
            drafts[wrong_at] = (drafts[wrong_at] + 1) % 259
        runner.execute(StepBatch([SequenceWork("r", prompt, 0, tables, sample=True)]))
        out = runner.execute(
            StepBatch(
                [
                    SequenceWork(
                        "r", [truth[0]], len(prompt), tables, sample=True, draft_token_ids=drafts
                    )
                ]
            )
        )
        seq = out.sequences[0]
        accepted = 5 if wrong_at is None else wrong_at
        assert seq.num_accepted_tokens == accepted
        assert seq.token_ids == truth[1 : accepted + 2]


def test_chunked_prefill_writes_the_same_draft_kv(tiny, tiny_draft):
    """next_token_id lets a non-final chunk write the draft KV of its last position."""
    prompt = PROMPTS[3]
    proposals, pages = [], []
    for chunk in (1000, 16, 7):
        runner = ModelRunner(tiny.model, num_blocks=64, draft=tiny_draft, num_speculative_tokens=3)
        maker = TableMaker(runner)
        tables = maker.fresh(len(prompt) + 3)
        pos = 0
        while pos < len(prompt):
            n = min(chunk, len(prompt) - pos)
            last = pos + n == len(prompt)
            out = runner.execute(
                StepBatch(
                    [
                        SequenceWork(
                            "r",
                            prompt[pos : pos + n],
                            pos,
                            tables,
                            sample=last,
                            next_token_id=None if last else prompt[pos + n],
                        )
                    ]
                )
            )
            pos += n
        proposals.append(out.sequences[0].draft_token_ids)
        g = runner.layout.draft_slot.group
        full_blocks = len(prompt) // 16  # blocks wholly inside the prompt hold committed KV
        pages.append(runner.kv.read_pages(g, tables[g][:full_blocks]))
    assert proposals[0] == proposals[1] == proposals[2]
    torch.testing.assert_close(pages[1], pages[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(pages[2], pages[0], atol=1e-5, rtol=0)


def test_missing_next_token_is_rejected(tiny, tiny_draft):
    runner = ModelRunner(tiny.model, num_blocks=16, draft=tiny_draft, num_speculative_tokens=2)
    tables = TableMaker(runner).fresh(32)
    with pytest.raises(ValueError, match="next_token_id"):
        runner.execute(StepBatch([SequenceWork("r", [5, 6, 7], 0, tables)]))


def test_rejection_sampling_preserves_the_distribution(tiny):
    """Verify drafts [d1, d2] at temperature 1 / top-k 4 for many seeds in batches.

    Each request computes prompt P and verifies d1 (the target's 2nd most likely token,
    so it is often rejected) then d2 (the most likely after P + d1). Exactness means:
    the first emitted token ~ p(.|P); given it is d1, the second ~ p(.|P d1); given both
    drafts accepted, the third ~ p(.|P d1 d2). Tolerance: a frequency over n trials has
    standard deviation <= 0.5/sqrt(n); we allow 5 of those (a false failure has
    probability < 1e-6 per cell), while a wrong acceptance rule moves these frequencies
    by tens of percent.
    """
    params = SamplingParams(temperature=1.0, top_k=4)
    prompt = PROMPTS[0]
    scorer = ModelRunner(tiny.model, num_blocks=16)

    def dist(tokens):
        tables = TableMaker(scorer).fresh(len(tokens))
        logits = scorer.score(StepBatch([SequenceWork("s", tokens, 0, tables)]))[0][-1]
        return probabilities(logits, params)

    p1 = dist(prompt)
    d1 = int(torch.argsort(p1, descending=True)[1])
    p2 = dist([*prompt, d1])
    d2 = int(torch.argmax(p2))
    p3 = dist([*prompt, d1, d2])

    runner = ModelRunner(tiny.model, num_blocks=1 + 250 * 2)
    first, second, third = Counter(), Counter(), Counter()
    trials = 3000
    for base in range(0, trials, 250):
        maker = TableMaker(runner)
        works = [
            SequenceWork(
                f"r{s}",
                prompt,
                0,
                maker.fresh(len(prompt) + 2),
                sample=True,
                sampling=SamplingParams(temperature=1.0, top_k=4, seed=s),
                draft_token_ids=[d1, d2],
            )
            for s in range(base, base + 250)
        ]
        for out in runner.execute(StepBatch(works)).sequences:
            t = out.token_ids
            first[t[0]] += 1
            if t[0] == d1:
                second[t[1]] += 1
                if t[1] == d2:
                    third[t[2]] += 1

    def check(counts: Counter, p: torch.Tensor):
        n = sum(counts.values())
        assert n >= 200, "too few samples to judge"
        assert set(counts) <= set(torch.nonzero(p).flatten().tolist())  # top-k respected
        for token in torch.nonzero(p).flatten().tolist():
            assert abs(counts[token] / n - float(p[token])) < 5 * 0.5 / math.sqrt(n)

    check(first, p1)
    check(second, p2)
    check(third, p3)


def test_seeded_sampling_ignores_batch_composition(tiny):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    alone = (
        OfflineGenerator(ModelRunner(tiny.model, num_blocks=64))
        .generate([PROMPTS[1]], 16, params)[0]
        .output_ids
    )
    mixed = OfflineGenerator(ModelRunner(tiny.model, num_blocks=200)).generate(
        PROMPTS, 16, [SamplingParams(temperature=0.7, seed=9), params, GREEDY, params]
    )
    assert mixed[1].output_ids == alone
    chunked = (
        OfflineGenerator(ModelRunner(tiny.model, num_blocks=64), chunk_tokens=9)
        .generate([PROMPTS[1]], 16, params)[0]
        .output_ids
    )
    assert chunked == alone


def test_propose_false_writes_committed_draft_kv_without_lookahead(tiny, tiny_draft):
    """A prefill engine handing over: same committed draft KV, no proposals, no lookahead."""
    prompt = random_tokens(64, 259, seed=64)  # exactly 4 blocks: no room past the prompt
    pages, outs = [], []
    for propose in (True, False):
        runner = ModelRunner(tiny.model, num_blocks=64, draft=tiny_draft, num_speculative_tokens=3)
        maker = TableMaker(runner)
        tables = maker.fresh(len(prompt) + (3 if propose else 0))
        out = runner.execute(
            StepBatch([SequenceWork("r", prompt, 0, tables, sample=True, propose=propose)])
        ).sequences[0]
        outs.append(out)
        g = runner.layout.draft_slot.group
        full = len(prompt) // 16
        pages.append(runner.kv.read_pages(g, tables[g][:full]))
    assert outs[0].token_ids == outs[1].token_ids
    assert len(outs[0].draft_token_ids) == 3 and outs[1].draft_token_ids == []
    torch.testing.assert_close(pages[0], pages[1], atol=1e-6, rtol=0)


def test_one_model_serves_runners_with_different_layouts(tmp_path):
    """A full draft on an all-sliding model adds a group in front of the target's."""
    from relaykv.model import load_model
    from relaykv.model.loading.export import save_hf_dir
    from relaykv.model.presets import init_random_weights
    from relaykv.model.transformer import empty_model

    cfg = load_model().config.with_updates(
        architecture="mistral",
        layer_types=("sliding_attention",) * 2,
        num_layers=2,
        sliding_window=24,
        qk_norm=False,
    )
    model = init_random_weights(empty_model(cfg), seed=1, residual_scale=0.3)
    model = load_model(str(save_hf_dir(model, tmp_path / "m"))).model
    plain = ModelRunner(model, num_blocks=64)
    spec = ModelRunner(
        model, num_blocks=64, draft=random_draft(cfg, seed=2), num_speculative_tokens=2
    )
    assert [g.kind for g in plain.geometry.groups] == ["sliding"]
    assert [(g.kind, g.draft) for g in spec.geometry.groups] == [("full", True), ("sliding", False)]
    prompt = random_tokens(60, 259, seed=5)
    outs = []
    for runner in (plain, spec, plain):  # interleaved use of the same model object
        outs.append(OfflineGenerator(runner, chunk_tokens=25).generate([prompt], 10)[0].output_ids)
    assert outs[0] == outs[1] == outs[2]
