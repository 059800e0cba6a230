"""The GGUF tokenizer cache: a cached tokenizer is the fresh build (reference: the builder
itself, `build_gguf_tokenizer`), a changed vocabulary misses, a broken entry is rebuilt."""

from __future__ import annotations

from pathlib import Path

from relaykv.model.loading.gguf_tokenizer import build_gguf_tokenizer
from relaykv.model.loading.tokenizer_cache import SUBDIR, cache_key, cached_gguf_tokenizer

from .gguf_vocab import gemma_like_meta

TEXTS = ["<start_of_turn>ab\n\nab<end_of_turn>\na", "abba ba", "", "zz ab\n"]


def _meta(extra: str = "ba") -> dict:
    return gemma_like_meta(["a", "b", "ab", " ", extra, "abb"])


def _same(a, b) -> None:
    assert a.model.to_str() == b.model.to_str()
    assert (a.eos_token_ids, a.bos_token_id, a.add_bos) == (
        b.eos_token_ids,
        b.bos_token_id,
        b.add_bos,
    )
    for text in TEXTS:
        assert a.encode(text) == b.encode(text)
        assert a.decode(a.encode(text)) == b.decode(b.encode(text))


def test_a_cached_tokenizer_is_the_fresh_build(tmp_path: Path) -> None:
    meta = _meta()
    fresh = build_gguf_tokenizer(meta, "gemma3")
    first = cached_gguf_tokenizer(meta, "gemma3", tmp_path)  # miss: builds and stores
    entries = list((tmp_path / SUBDIR).iterdir())
    assert [e.name for e in entries] == [f"{cache_key(meta, 'gemma3')}.json"]
    again = cached_gguf_tokenizer(meta, "gemma3", tmp_path)  # hit: read back
    _same(first, fresh)
    _same(again, fresh)
    assert cached_gguf_tokenizer(meta, "gemma3", None).encode(TEXTS[0]) == fresh.encode(TEXTS[0])


def test_a_changed_vocabulary_misses_and_a_broken_entry_is_rebuilt(tmp_path: Path) -> None:
    cached_gguf_tokenizer(_meta(), "gemma3", tmp_path)
    other = _meta("bb")
    assert cache_key(other, "gemma3") != cache_key(_meta(), "gemma3")
    assert cache_key(_meta(), "gemma3") != cache_key(_meta(), "llama")
    _same(cached_gguf_tokenizer(other, "gemma3", tmp_path), build_gguf_tokenizer(other, "gemma3"))
    entry = tmp_path / SUBDIR / f"{cache_key(other, 'gemma3')}.json"
    entry.write_text("{not json")
    _same(cached_gguf_tokenizer(other, "gemma3", tmp_path), build_gguf_tokenizer(other, "gemma3"))
    assert entry.read_text().startswith("{")  # rewritten whole
    assert len(list((tmp_path / SUBDIR).iterdir())) == 2  # no temporary files left
