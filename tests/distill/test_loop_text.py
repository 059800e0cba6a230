"""Loop windows: offline text, then one of its spans repeated to the window's end."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from relaykv.distill import loop_text, text_corpus
from relaykv.distill.corpus import load_shard
from relaykv.distill.data import build_text
from relaykv.distill.prefill import text_shard
from relaykv.distill.recipes import RECIPES
from relaykv.distill.trainer import stack_corpus
from relaykv.model import load_model
from relaykv.model.loading.tokenizer import ByteTokenizer

# Text with no period of its own, so any period in a window is the loop's.
DOCS = {
    "a": [" ".join(f"Sentence {i} says {i * i}." for i in range(150))],
    "b": ["\n".join(f"x{i} = {i * 7 % 13}" for i in range(150))],
}


def _small_sources(monkeypatch) -> None:
    monkeypatch.setattr(
        text_corpus, "SOURCES", {name: (lambda d=d: iter(d)) for name, d in DOCS.items()}
    )


def _period(window: list[int], start: int) -> int | None:
    """The smallest p <= 40 with window[i] == window[i - p] for every i >= start."""
    for p in range(1, 41):
        if all(window[i] == window[i - p] for i in range(max(start, p), len(window))):
            return p
    return None


def test_windows_are_text_then_a_repeated_span(monkeypatch) -> None:
    _small_sources(monkeypatch)
    tok = ByteTokenizer()
    windows = loop_text.loop_windows(tok, 12, 256)
    texts = text_corpus.text_windows(tok, 12, 256, loop_text.LOOP_WINDOW_SEED)
    assert len(windows) == len(texts) == 12
    assert windows == loop_text.loop_windows(tok, 12, 256)  # seeded
    for window, text in zip(windows, texts, strict=True):
        assert len(window) == 256 and window[0] == ByteTokenizer.BOS
        assert window[: loop_text.FIRST_CUT] == text[: loop_text.FIRST_CUT]
        # Past the last possible cut plus the longest span, the window is periodic.
        last = loop_text.LAST_CUT + max(loop_text.SPAN_LENGTHS)
        assert _period(window, last) is not None
    # Not all loops are the text's own period: the cut lands mid-text.
    assert any(window != text for window, text in zip(windows, texts, strict=True))


def test_loop_shards_are_teacher_forced_and_sampled_with_generated_text(
    monkeypatch, tmp_path: Path
) -> None:
    _small_sources(monkeypatch)
    loaded = load_model("tiny-hybrid")
    recipe = replace(
        RECIPES["tiny-hybrid"], text_windows=0, loop_windows=3, shard_windows=2, text_len=160
    )
    paths = build_text(recipe, loaded, tmp_path, progress=False)
    assert [p.name for p in paths] == ["loop-0000.safetensors", "loop-0001.safetensors"]
    windows = loop_text.loop_windows(loaded.tokenizer, 3, 160)
    first = load_shard(paths[0])
    reference = text_shard(loaded.model, windows[:2], max(recipe.candidates, 1))
    assert first.tokens.tolist() == windows[:2]
    assert torch.equal(first.labels, reference.labels)
    assert (first.prompt_lens == 1).all()  # the BOS: every later position is trained
    data = stack_corpus([first, load_shard(paths[1])])
    assert bool(data.generated.all()) and bool(data.loss_ce[:, :-1].any(dim=1).all())
    stamp = paths[0].stat().st_mtime_ns
    assert build_text(recipe, loaded, tmp_path, progress=False) == paths
    assert paths[0].stat().st_mtime_ns == stamp  # resumed, not rebuilt
