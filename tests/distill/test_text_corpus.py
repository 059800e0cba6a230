"""Offline text windows: exact length, BOS first, seeded, drawn from every source."""

from __future__ import annotations

from relaykv.distill import text_corpus
from relaykv.model.loading.tokenizer import ByteTokenizer


def test_windows_are_seeded_bos_first_and_of_exact_length(monkeypatch) -> None:
    docs = {"a": ["alpha " * 50, "short"], "b": ["beta gamma " * 40]}
    monkeypatch.setattr(
        text_corpus, "SOURCES", {name: (lambda d=d: iter(d)) for name, d in docs.items()}
    )
    tok = ByteTokenizer()
    windows = text_corpus.text_windows(tok, 1000, 32, seed=3)
    # "alpha " * 50 = 300 bytes -> 9 windows of 31; "short": none; 440 bytes -> 14 windows.
    assert len(windows) == 9 + 14
    assert all(len(w) == 32 and w[0] == ByteTokenizer.BOS for w in windows)
    assert windows == text_corpus.text_windows(tok, 1000, 32, seed=3)
    assert windows != text_corpus.text_windows(tok, 1000, 32, seed=4)
    assert text_corpus.text_windows(tok, 5, 32, seed=3) == windows[:5]
    text = {tok.decode(w) for w in windows}
    assert any("alpha" in t for t in text) and any("gamma" in t for t in text)


def test_the_real_sources_yield_text() -> None:
    for name, source in text_corpus.SOURCES.items():
        assert any(len(doc) > 200 for doc in source()), name
