"""Turning random token ids into text prompts with a local `tokenizers` file.

Used only when prompts are sent as text (chat endpoints, or `--prompt-format text`).
The rule is vLLM's `gen_prompt_decode_to_target_len`: decode the ids, re-encode the text
without special tokens, and while the length differs from the target (at most 10 rounds)
truncate or pad with random ids and try again. The request then carries the final text and
the ids it re-encodes to, so `prompt_len` is what a server with this tokenizer counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from relaykv.common.workloads.sample import DatasetError, SampleRequest

MAX_ROUNDS = 10


class PromptTokenizer:
    """A `tokenizers.Tokenizer` loaded from `tokenizer.json` (a file or a directory)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer  # only text mode needs it

        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise DatasetError(f"--tokenizer: no tokenizer.json at {path}")
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception on bad files
            raise DatasetError(f"--tokenizer: cannot load {file}: {exc}") from exc
        self.path = str(path)

    @property
    def vocab_size(self) -> int:
        """Base vocabulary without added tokens (what `transformers`' `vocab_size` means)."""
        return int(self._tok.get_vocab_size(with_added_tokens=False))

    @property
    def special_ids(self) -> list[int]:
        decoder = self._tok.get_added_tokens_decoder()
        return sorted(i for i, tok in decoder.items() if tok.special)

    def num_special_tokens_to_add(self) -> int:
        return len(self._tok.encode("", add_special_tokens=True).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def to_text(self, ids: list[int], rng: np.random.Generator) -> tuple[str, list[int]]:
        """Text whose re-encoding has `len(ids)` tokens when reachable in 10 rounds."""
        target = len(ids)
        seq = list(ids)
        rounds = MAX_ROUNDS
        while True:
            text = self.decode(seq)
            seq = self.encode(text)
            if rounds <= 0 or len(seq) == target:
                return text, seq
            if len(seq) < target:
                seq.extend(rng.integers(0, self.vocab_size, size=target - len(seq)).tolist())
            else:
                seq = seq[:target]
            rounds -= 1


def as_text_requests(requests: list[SampleRequest], tokenizer: PromptTokenizer, seed: int) -> int:
    """Give every request its text form in place; returns the total length mismatch."""
    rng = np.random.default_rng(seed)
    mismatch = 0
    for req in requests:
        target = req.prompt_len
        req.prompt, req.prompt_ids = tokenizer.to_text(req.prompt_ids, rng)
        mismatch += req.prompt_len - target
    return mismatch
