"""Text prompts from token ids: vLLM's decode / re-encode / adjust rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from relaykv.bench.text_prompts import PromptTokenizer, as_text_requests
from relaykv.common.workloads import DatasetError, SampleRequest


@pytest.fixture
def word_tokenizer(tmp_path: Path) -> Path:
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(20)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens([AddedToken("<s>", special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_loads_from_a_directory_and_reports_vocab(word_tokenizer: Path) -> None:
    tok = PromptTokenizer(word_tokenizer)
    assert tok.vocab_size == 21
    assert tok.special_ids == [21]
    assert tok.num_special_tokens_to_add() == 0


def test_round_trip_keeps_ids_when_the_tokenizer_is_lossless(word_tokenizer: Path) -> None:
    tok = PromptTokenizer(word_tokenizer / "tokenizer.json")
    reqs = [SampleRequest([1, 2, 3, 4], 5), SampleRequest([7, 7, 9], 2)]
    assert as_text_requests(reqs, tok, seed=0) == 0
    assert reqs[0].prompt == "w0 w1 w2 w3" and reqs[0].prompt_ids == [1, 2, 3, 4]
    assert reqs[1].prompt_len == 3


class DigitTokenizer(PromptTokenizer):
    """Ids 0..99 decode to their digits and digits re-encode one by one (lossy)."""

    def __init__(self) -> None:
        self.path = "digits"

    @property
    def vocab_size(self) -> int:
        return 10

    def decode(self, ids: list[int]) -> str:
        return "".join(str(i) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [int(c) for c in text]


def test_too_long_re_encoding_is_truncated_to_the_target() -> None:
    text, ids = DigitTokenizer().to_text([12, 3], np.random.default_rng(0))
    assert (text, ids) == ("12", [1, 2])


def test_too_short_re_encoding_is_padded_with_random_ids() -> None:
    class Dropping(DigitTokenizer):
        def encode(self, text: str) -> list[int]:
            return [int(c) for c in text if c != "5"]  # "5" vanishes on re-encoding

    class Sevens:
        def integers(self, low: int, high: int, size: int) -> np.ndarray:
            assert (low, high) == (0, 10)
            return np.full(size, 7)

    text, ids = Dropping().to_text([5, 1, 2], Sevens())  # type: ignore[arg-type]
    assert (text, ids) == ("127", [1, 2, 7])


def test_gives_up_after_ten_rounds_with_the_last_encoding() -> None:
    class Growing(DigitTokenizer):
        def encode(self, text: str) -> list[int]:
            return [int(c) for c in text] + [1]  # always one token too many

    text, ids = Growing().to_text([1, 2], np.random.default_rng(0))
    assert len(ids) == 3 and text == "12"


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="--tokenizer"):
        PromptTokenizer(tmp_path / "nope")
