"""Incremental detokenization and stop strings.

Decoding only the tokens since the previous emission (plus the tokens of that emission as left
context) keeps the cost per token constant, as vLLM does: text is emitted once the decoding
grows and does not end in an incomplete UTF-8 sequence (U+FFFD), so multi-byte characters
split across tokens come out whole.
"""

from __future__ import annotations

from typing import Protocol

from relaykv.engine.request import Request


class Tokenizer(Protocol):
    def decode(self, ids: list[int]) -> str: ...


def detokenize_new(tokenizer: Tokenizer, req: Request, skip_ids: frozenset[int]) -> str:
    """Text of the output tokens appended since the last call (may be empty)."""
    ids = [t for t in req.output_ids if t not in skip_ids] if skip_ids else req.output_ids
    if req.read_offset >= len(ids):
        return ""
    prefix = tokenizer.decode(ids[req.prefix_offset : req.read_offset])
    full = tokenizer.decode(ids[req.prefix_offset :])
    if len(full) > len(prefix) and not full.endswith("\ufffd"):
        # The next call decodes from the old read offset: a short left context that
        # tokenizers need to place spaces right.
        req.prefix_offset, req.read_offset = req.read_offset, len(ids)
        return full[len(prefix) :]
    return ""


def find_stop(text: str, new_len: int, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Earliest stop string that ends inside the last `new_len` characters of `text`."""
    best: tuple[int, str] | None = None
    for stop in stops:
        start = max(0, len(text) - new_len - len(stop) + 1)
        at = text.find(stop, start)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    return best
