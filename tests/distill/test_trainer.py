"""Training a draft: it learns (acceptance far above a random draft's, measured on the
engine with speculative output equal to plain greedy output), and a run interrupted
mid-way and rerun ends with exactly the weights of an uninterrupted run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from relaykv.distill.data import build_corpus, load_corpus
from relaykv.distill.evaluate import measure_acceptance, top1_agreement
from relaykv.distill.heldout import held_out_prompts
from relaykv.distill.recipes import RECIPES
from relaykv.distill.trainer import pick_batch, stack_corpus, train_draft
from relaykv.model import load_model, random_draft

RECIPE = replace(
    RECIPES["tiny-hybrid"],
    num_prompts=16,
    gen_len=48,
    shard_prompts=16,
    token_budget=40 * 8 * 62,
    batch_sequences=8,
    checkpoint_every=3,
)


@pytest.fixture(scope="module")
def corpus_paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    loaded = load_model("tiny-hybrid")
    return build_corpus(RECIPE, loaded, tmp_path_factory.mktemp("data"), progress=False)


@pytest.fixture(scope="module")
def corpus(corpus_paths: list[Path]):
    return load_model("tiny-hybrid"), stack_corpus(load_corpus(corpus_paths))


@pytest.mark.slow
def test_a_distilled_draft_beats_a_random_one_and_stays_lossless(corpus, tmp_path: Path) -> None:
    loaded, data = corpus
    draft = train_draft(loaded.model, RECIPE, data, tmp_path / "state.pt", progress=False)
    prompts = held_out_prompts(RECIPE, loaded, count=6)
    trained = measure_acceptance(loaded.model, draft, prompts, 24, (), ks=(1, 3))
    random = measure_acceptance(loaded.model, random_draft(loaded.config, seed=1), prompts, 24, ())
    for result in (*trained, *random):
        assert result.equal_prompts == result.prompts  # speculation never changes greedy output
    assert trained[0].acceptance_rate > random[0].acceptance_rate + 0.2
    assert trained[1].mean_accepted_length > random[1].mean_accepted_length
    # The cheap check agrees: the draft's argmax is the target's far more often.
    agree = top1_agreement(loaded.model, draft, data)
    assert agree > top1_agreement(loaded.model, random_draft(loaded.config, seed=1), data) + 0.2


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"candidates": 4, "unroll_weight": 0.5, "ce_weight": 0.3},
        {"generated_share": 0.25},
    ],
    ids=["full-vocabulary", "candidates-unrolled", "generated-share"],
)
def test_an_interrupted_run_resumes_to_the_same_weights(corpus, tmp_path: Path, changes) -> None:
    loaded, data = corpus
    recipe = replace(RECIPE, token_budget=10 * 8 * 62, **changes)
    if "generated_share" in changes:  # half the sequences stand for teacher-forced text
        data = replace(data, generated=torch.arange(len(data.tokens)) % 2 == 0)
        picks = [pick_batch(recipe, data, torch.Generator().manual_seed(s)) for s in range(5)]
        assert all(int(data.generated[p].sum()) == 2 and len(set(p.tolist())) == 8 for p in picks)
    straight = train_draft(loaded.model, recipe, data, tmp_path / "a.pt", progress=False)

    def stop_at(step: int) -> None:
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_draft(loaded.model, recipe, data, tmp_path / "b.pt", progress=False, on_step=stop_at)
    assert torch.load(tmp_path / "b.pt", weights_only=True)["step"] == 3  # last checkpoint
    resumed = train_draft(loaded.model, recipe, data, tmp_path / "b.pt", progress=False)
    want, got = straight.state_dict(), resumed.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_max_len_cuts_sequences_before_padding(corpus, corpus_paths: list[Path]) -> None:
    _, full = corpus
    cut = stack_corpus(load_corpus(corpus_paths), max_len=20)
    assert cut.tokens.shape[1] == 20 and cut.hidden.shape[1] == 19
    assert torch.equal(cut.tokens, full.tokens[:, :20])
    assert torch.equal(cut.labels, full.labels[:, :19])
    assert torch.equal(cut.loss_reg, full.loss_reg[:, :18])  # positions p with token p+2 < 20
    assert torch.equal(cut.loss_ce, full.loss_ce[:, :18])
