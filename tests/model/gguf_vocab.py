"""A tiny Gemma-shaped GGUF vocabulary for tokenizer tests: six control tokens (special,
skipped when decoding), two user-defined newline tokens (text), then the given normal ones.
Ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <start_of_turn> 4, <end_of_turn> 5, "\\n" 6,
"\\n\\n" 7, then `normal` from 8."""

from __future__ import annotations

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # GGUF token types


def gemma_like_meta(normal: list[str]) -> dict:
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n", "\n\n"]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens + normal,
        "tokenizer.ggml.token_type": [CONTROL] * 6 + [USER_DEFINED] * 2 + [NORMAL] * len(normal),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.add_bos_token": True,
    }
