"""`relaykv tokenizer export`: a directory transformers loads offline and that encodes, decodes
and renders chat exactly as the server does."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from relaykv.cli import main
from relaykv.model.loading.tokenizer import ByteTokenizer, HFTokenizer
from relaykv.model.text.chat_template import ChatFormatter, TemplateSource, fallback_prompt
from relaykv.model.text.tokenizer_export import TokenizerExport, export_tokenizer

transformers = pytest.importorskip("transformers")

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
]


def _texts() -> list[str]:
    rng = random.Random(5)
    alphabet = "ab \n\t.<>/s0x\u00e9\u4e2d\U0001f642"
    return ["", "hello", "<0x41>", *("".join(rng.choices(alphabet, k=30)) for _ in range(50))]


def test_tiny_hybrid_export_matches_the_byte_tokenizer(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["tokenizer", "export", "--model", "tiny-hybrid", "--out", str(tmp_path)]) == 0
    assert str(tmp_path) in capsys.readouterr().out
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = ByteTokenizer()
    for text in _texts():
        assert hf.encode(text) == ours.encode(text), text
        assert hf.decode(ours.encode(text)[1:]) == ours.decode(ours.encode(text))
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (1, 2, 0)
    assert len(hf) == ours.vocab_size
    # Random prompt ids drawn as vLLM's and SGLang's clients draw them (vocabulary minus the
    # special ids) are ASCII bytes, so their text round-trips to the same number of ids.
    allowed = sorted(set(range(hf.vocab_size)) - set(hf.all_special_ids))
    assert allowed == list(range(3, 3 + 0x80))
    ids = random.Random(1).choices(allowed, k=500)
    assert hf.encode(hf.decode(ids), add_special_tokens=False) == ids
    # The exported template renders the server's prompt, and its ids are the server's.
    rendered = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == "<s>" + fallback_prompt(MESSAGES)
    server_ids = ChatFormatter(ours).encode(MESSAGES)
    assert hf.encode(rendered, add_special_tokens=False) == server_ids
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["model_max_length"] > 0 and config["eos_token"] == "</s>"


def test_a_tokenizers_tokenizer_keeps_its_template_and_gets_its_bos(tmp_path) -> None:
    vocab = {"<unk>": 0, "<bos>": 1, "<eos>": 2, "hi": 3, "there": 4, "<end_of_turn>": 5}
    model = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = Whitespace()
    ours = HFTokenizer(model, [2], bos_token_id=1, add_bos=True)
    template = TemplateSource(
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}",
        "<bos>",
        "<eos>",
        "t",
    )
    export = TokenizerExport(ours, ChatFormatter(ours, template, 1), 128, "test")
    hf = transformers.AutoTokenizer.from_pretrained(str(export_tokenizer(export, tmp_path)))
    assert hf.encode("hi there") == ours.encode("hi there") == [1, 3, 4]
    assert hf.chat_template == template.template and hf.eos_token == "<eos>"
