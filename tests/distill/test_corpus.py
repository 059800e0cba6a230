"""The distillation corpus, recorded while the real engine generates.

Reference: a dense forward of the finished sequences (`DenseContext`, no paging, no
engine): the recorded hidden states must equal its final-norm hidden states, and every
generated token must be the argmax of its logits (greedy).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from relaykv.distill.corpus import collect_shard, load_shard, save_shard
from relaykv.distill.data import build_corpus, split_validation
from relaykv.distill.labels import SMALL_VOCAB
from relaykv.distill.prefill import text_shard
from relaykv.distill.recipes import RECIPES
from relaykv.model import load_model
from relaykv.model.forward_context import DenseContext
from relaykv.model.presets import init_random_weights
from relaykv.model.transformer import empty_model

SMALL = replace(
    RECIPES["tiny-hybrid"], num_prompts=6, prompt_tokens=12, gen_len=20, shard_prompts=3
)


@pytest.mark.parametrize("vocab", [None, SMALL_VOCAB + 256])
def test_recorded_hidden_states_match_a_dense_forward(vocab: int | None) -> None:
    # vocab > SMALL_VOCAB: the engine samples through the shortlisted head
    # (`labels.ShortlistHead.greedy_logits`); tokens must still be the full head's argmax.
    target = load_model("tiny-hybrid").model
    if vocab is not None:
        config = target.config.with_updates(vocab_size=vocab)
        target = init_random_weights(empty_model(config), seed=5).eval()
    gen = torch.Generator().manual_seed(3)
    # Different prompt lengths; more prompts than the engine runs at once (concurrency 2)
    # so some wait, and a 70-token prompt prefilled in chunks is not needed: lengths vary.
    prompts = [torch.randint(3, 259, (n,), generator=gen).tolist() for n in (5, 17, 33, 9)]
    shard = collect_shard(target, prompts, 24, (), concurrency=2)
    assert shard.tokens.shape[0] == 4
    for i, prompt in enumerate(prompts):
        n = int(shard.lengths[i])
        seq = shard.tokens[i, :n]
        assert seq[: len(prompt)].tolist() == prompt and int(shard.prompt_lens[i]) == len(prompt)
        assert n == len(prompt) + 24 and (shard.tokens[i, n:] == -1).all()
        with torch.no_grad():
            ctx = DenseContext(target.build_rotaries(), 1, n, torch.float32)
            dense = target(seq, ctx)
            greedy = torch.argmax(target.logits(dense), dim=-1)
        torch.testing.assert_close(shard.hidden[i, : n - 1], dense[: n - 1], atol=2e-4, rtol=1e-4)
        assert seq[len(prompt) :].tolist() == greedy[len(prompt) - 1 : n - 1].tolist()
        # The recorded labels are the target's own choices at every position.
        assert shard.labels[i, : n - 1].tolist() == greedy[: n - 1].tolist()
        assert (shard.labels[i, n - 1 :] == -1).all()


def test_a_text_shard_equals_a_dense_forward_and_labels_it() -> None:
    loaded = load_model("tiny-hybrid")
    target = loaded.model
    gen = torch.Generator().manual_seed(4)
    windows = torch.randint(3, 259, (11, 20), generator=gen).tolist()  # > one forward batch
    shard = text_shard(target, windows, candidates=3)
    assert shard.tokens.tolist() == windows and (shard.prompt_lens == 0).all()
    with torch.no_grad():
        dense = target(
            torch.tensor(windows).flatten(),
            DenseContext(target.build_rotaries(), 11, 20, torch.float32),
        )
        logits = target.logits(dense).view(11, 20, -1)[:, :19]
    torch.testing.assert_close(shard.hidden, dense.view(11, 20, -1)[:, :19])
    assert torch.equal(shard.labels, logits.argmax(-1))
    assert torch.equal(shard.cands, logits.topk(3, dim=-1).indices)


def test_shards_round_trip_and_a_rerun_resumes(tmp_path: Path) -> None:
    loaded = load_model("tiny-hybrid")
    paths = build_corpus(SMALL, loaded, tmp_path, progress=False)
    assert [p.name for p in paths] == ["shard-0000.safetensors", "shard-0001.safetensors"]
    first = load_shard(paths[0])
    assert first.tokens.shape == (3, 32) and int(first.lengths.sum()) == 3 * 32
    stamps = [p.stat().st_mtime_ns for p in paths]
    paths[1].unlink()
    again = build_corpus(SMALL, loaded, tmp_path, progress=False)
    assert paths[0].stat().st_mtime_ns == stamps[0]  # kept, not regenerated
    assert torch.equal(load_shard(again[1]).tokens, load_shard(again[1]).tokens)
    save_shard(first, tmp_path / "copy.safetensors")
    copy = load_shard(tmp_path / "copy.safetensors")
    assert torch.equal(copy.tokens, first.tokens)
    torch.testing.assert_close(copy.hidden, first.hidden)  # bfloat16 on disk
    assert torch.equal(copy.labels, first.labels) and torch.equal(copy.cands, first.cands)


def test_the_last_text_shard_is_held_out() -> None:
    names = ["shard-0000", "text-0000", "text-0001", "text-0002"]
    paths = [Path(f"/d/{n}.safetensors") for n in names]
    train, held = split_validation(paths)
    assert held == [paths[-1]] and train == paths[:-1]
    assert split_validation(paths[:2]) == (paths[:2], [])  # one text shard: nothing held out
