"""`ModelInfo`: a loaded model as the server sees it (a leaf of `relaykv.serve`, imported by
both the engine factory and the model loader, so neither imports the other's module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # relaykv.model loads torch: not before the flags are parsed
    from relaykv.model.text.chat_template import ChatFormatter, TextTokenizer


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A loaded model as the server sees it (the executor is built separately)."""

    name: str  # default served model name
    source: str  # preset name, directory or file
    vocab_size: int
    max_position_embeddings: int | None = None
    tokenizer: TextTokenizer | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    chat: ChatFormatter | None = None
    tokenizer_dir: str | None = None  # a Hugging Face tokenizer directory (tokenizer_export)
    description: str = ""
