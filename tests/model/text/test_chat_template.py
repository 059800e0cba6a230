"""Chat template discovery and rendering (HF directory, GGUF metadata, fallback)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from relaykv.model.text.chat_template import (
    ChatFormatter,
    ChatTemplateError,
    fallback_prompt,
    find_chat_template,
)

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class WordTokenizer:
    """Each character is one id (ord); BOS is 1 and is added on every encode."""

    def encode(self, text: str) -> list[int]:
        return [1, *(ord(c) for c in text)]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids if i > 1)


def test_hf_dir_tokenizer_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": TEMPLATE,
                "bos_token": {"content": "<s>"},
                "eos_token": "</s>",
            }
        )
    )
    source = find_chat_template(tmp_path)
    assert source is not None and source.bos_token == "<s>" and source.eos_token == "</s>"
    chat = ChatFormatter(WordTokenizer(), source, bos_token_id=1)
    messages = [{"role": "user", "content": "hi"}]
    text = chat.render(messages)
    assert text == "<s><|user|>hi</s>\n<|assistant|>"
    ids = chat.encode(messages)
    # The template's BOS text is not encoded as characters, and BOS is not doubled.
    assert ids[0] == 1 and ids[1] != 1 and WordTokenizer().decode(ids) == text[3:]
    assert chat.render(messages, add_generation_prompt=False).endswith("</s>\n")
    with pytest.raises(ChatTemplateError, match="no tools here"):
        chat.render([{"role": "tool", "content": "x"}])


def test_named_templates_and_jinja_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "tool_use", "template": "T"},
                    {"name": "default", "template": "D"},
                ]
            }
        )
    )
    assert find_chat_template(tmp_path).template == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    chat = ChatFormatter(WordTokenizer(), find_chat_template(tmp_path))
    assert chat.render([{"role": "user", "content": "x"}]) == "Jx"


def test_no_template_means_fallback(tmp_path: Path) -> None:
    assert find_chat_template(tmp_path) is None
    assert find_chat_template("tiny-hybrid") is None
    chat = ChatFormatter(WordTokenizer(), None)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert chat.render(messages) == "system: S\nuser: U\nassistant:" == fallback_prompt(messages)
    assert "fallback" in chat.description


def test_gguf_metadata(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_chat_template(TEMPLATE)
    writer.add_token_list(["<pad>", "<s>", "</s>", "a"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("t", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    source = find_chat_template(path)
    assert source is not None and source.template == TEMPLATE
    assert (source.bos_token, source.eos_token) == ("<s>", "</s>")


def test_non_text_parts_are_refused() -> None:
    chat = ChatFormatter(WordTokenizer(), None)
    with pytest.raises(ChatTemplateError, match="image_url"):
        chat.render([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(ChatTemplateError, match="no tokenizer"):
        ChatFormatter(None, None).encode([{"role": "user", "content": "x"}])


GEMMA_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hello."},
]
GEMMA_PROMPT = (
    "<bos><start_of_turn>user\nBe brief.\n\nSay hello.<end_of_turn>\n<start_of_turn>model\n"
)


def test_gemma3_dir_without_template_gets_gemmas_template_and_stop_tokens(tmp_path) -> None:
    from relaykv.model.text.served_text import generation_config_eos

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 106]}))
    source = find_chat_template(tmp_path)
    assert source is not None and source.stop_tokens == ("<end_of_turn>",)
    assert "documented template" in source.origin
    assert ChatFormatter(None, source).render(GEMMA_MESSAGES) == GEMMA_PROMPT
    assert generation_config_eos(str(tmp_path)) == [1, 106]


def test_gemma3_gguf_without_template_gets_gemmas_template(tmp_path) -> None:
    gguf = pytest.importorskip("gguf")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from relaykv.model.loading.tokenizer import HFTokenizer
    from relaykv.model.text.served_text import turn_stop_ids

    path = tmp_path / "g.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_token_list(["<pad>", "<eos>", "<bos>", "<end_of_turn>"])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    source = find_chat_template(path)
    assert source is not None and source.bos_token == "<bos>"
    chat = ChatFormatter(None, source)
    assert chat.render(GEMMA_MESSAGES) == GEMMA_PROMPT
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<end_of_turn>": 3}
    tok = HFTokenizer(Tokenizer(WordLevel(vocab, unk_token="<pad>")), [1], 2)
    assert turn_stop_ids(tok, chat) == [3]
    with pytest.raises(ChatTemplateError, match="alternate"):
        chat.render([{"role": "assistant", "content": "x"}])
