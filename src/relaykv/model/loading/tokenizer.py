"""Tokenizers: the runtime's protocol, the built-in byte tokenizer, a `tokenizers` wrapper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenizers import Tokenizer as HFTokenizerModel


class Tokenizer(Protocol):
    """Text <-> token ids. `encode` adds the model's BOS when the model expects one."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """The tiny-hybrid tokenizer: 0 pad, 1 BOS, 2 EOS, then byte b as id b + 3 (UTF-8)."""

    PAD, BOS, EOS = 0, 1, 2
    OFFSET = 3

    @property
    def vocab_size(self) -> int:
        return 256 + self.OFFSET

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (self.EOS,)

    def encode(self, text: str) -> list[int]:
        return [self.BOS] + [b + self.OFFSET for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        data = bytes(i - self.OFFSET for i in ids if self.OFFSET <= i < self.OFFSET + 256)
        return data.decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers.Tokenizer` (from tokenizer.json or built from GGUF metadata)."""

    def __init__(
        self,
        model: HFTokenizerModel,
        eos_token_ids: Sequence[int],
        bos_token_id: int | None = None,
        add_bos: bool = False,
    ) -> None:
        self.model = model
        self._eos = tuple(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos and bos_token_id is not None

    @classmethod
    def from_file(
        cls, path: str, eos_token_ids: Sequence[int], bos_token_id: int | None = None
    ) -> HFTokenizer:
        # tokenizer.json carries its own post-processor (which adds BOS where the model
        # wants it), so nothing is added here.
        return cls(HFTokenizerModel.from_file(path), eos_token_ids, bos_token_id, add_bos=False)

    @property
    def vocab_size(self) -> int:
        return self.model.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    def encode(self, text: str) -> list[int]:
        ids = self.model.encode(text, add_special_tokens=True).ids
        if self.add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [int(self.bos_token_id), *ids]  # type: ignore[arg-type]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.model.decode(list(ids), skip_special_tokens=True)
