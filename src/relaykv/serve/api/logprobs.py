"""Log-probabilities in the two OpenAI shapes (legacy completions and chat).

Token strings are the tokenizer's decoding of the single id; without a tokenizer they are
`token_id:<id>` (vLLM's `--return-tokens-as-token-ids` form). The sampled token is always
listed in a completions `top_logprobs` entry, as vLLM does, so `logprobs: 0` still shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from relaykv.common.messages.steps import TokenLogprobs

if TYPE_CHECKING:  # relaykv.model loads torch
    from relaykv.model.text.chat_template import TextTokenizer


def engine_logprobs(requested: int | None) -> int:
    """Top-K the engine must return for an API request (0 still needs the sampled one)."""
    if requested is None:
        return 0
    return 1 if requested == 0 else requested


def token_text(tokenizer: TextTokenizer | None, token_id: int) -> str:
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id])


class CompletionLogprobs:
    """Builds `choices[i].logprobs` of /v1/completions; `text_offset` runs across chunks."""

    def __init__(self, tokenizer: TextTokenizer | None, top_n: int) -> None:
        self.tokenizer = tokenizer
        self.top_n = top_n
        self.offset = 0

    def build(self, entries: Sequence[TokenLogprobs]) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for entry in entries:
            text = token_text(self.tokenizer, entry.token_id)
            tokens.append(text)
            values.append(entry.logprob)
            top = {token_text(self.tokenizer, t): lp for t, lp in entry.top[: self.top_n]}
            top.setdefault(text, entry.logprob)
            tops.append(top)
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def chat_logprobs(
    tokenizer: TextTokenizer | None, entries: Sequence[TokenLogprobs], top_n: int
) -> dict[str, Any]:
    """`choices[i].logprobs` of /v1/chat/completions."""
    content = []
    for entry in entries:
        text = token_text(tokenizer, entry.token_id)
        top = []
        for t, lp in entry.top[:top_n]:
            s = token_text(tokenizer, t)
            top.append({"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))})
        content.append(
            {
                "token": text,
                "logprob": entry.logprob,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": top,
            }
        )
    return {"content": content}
