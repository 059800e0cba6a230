"""The target's labels: argmax and top candidates equal a full float32 LM head's.

Reference: `CausalLM.logits` over the whole vocabulary in float32 (what the runner samples
from). Both paths of `label_hidden` are checked: the small-vocabulary one (tiny-hybrid,
scored in float32) and the bfloat16 shortlist + float32 rescoring one (a random model
with a vocabulary above `SMALL_VOCAB`).
"""

from __future__ import annotations

import pytest
import torch

from relaykv.distill.labels import SMALL_VOCAB, ShortlistHead, label_hidden
from relaykv.model import load_model
from relaykv.model.forward_context import DenseContext
from relaykv.model.presets import init_random_weights
from relaykv.model.transformer import empty_model


def _hidden(model, length: int = 40, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(
        3, model.config.vocab_size, (2 * length,), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        return model(ids, DenseContext(model.build_rotaries(), 2, length, torch.float32))


@pytest.mark.parametrize("vocab", [None, 3 * SMALL_VOCAB])
def test_labels_are_the_float32_argmax_and_candidates_its_top_c(vocab: int | None) -> None:
    model = load_model("tiny-hybrid").model
    if vocab is not None:
        config = model.config.with_updates(vocab_size=vocab)
        model = init_random_weights(empty_model(config), seed=5).eval()
    hidden = _hidden(model)
    labels, cands = label_hidden(model, hidden, 4)
    with torch.no_grad():
        logits = model.logits(hidden)
    assert torch.equal(labels, logits.argmax(dim=-1))
    assert torch.equal(cands[:, 0], labels) and cands.shape == (len(hidden), 4)
    assert torch.equal(cands, logits.topk(4, dim=-1).indices)


@pytest.mark.parametrize("vocab", [None, 3 * SMALL_VOCAB])
def test_greedy_logits_pick_the_float32_argmax(vocab: int | None) -> None:
    model = load_model("tiny-hybrid").model
    if vocab is not None:
        config = model.config.with_updates(vocab_size=vocab)
        model = init_random_weights(empty_model(config), seed=6).eval()
    hidden = _hidden(model, seed=1)
    with torch.no_grad():
        logits = model.logits(hidden)
    greedy = ShortlistHead(model).greedy_logits(hidden)
    assert greedy.shape == logits.shape
    assert torch.equal(greedy.argmax(dim=-1), logits.argmax(dim=-1))
