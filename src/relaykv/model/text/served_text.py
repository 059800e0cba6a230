"""A loaded model's text as a server needs it: its chat formatter, the ids that end a reply
(generation_config.json's `eos_token_id`, the template's end-of-turn tokens), and its
tokenizer as a Hugging Face directory in relaykv's cache (`relaykv tokenizer export` writes
the same directory anywhere)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from relaykv.model.text.chat_template import ChatFormatter, find_chat_template
from relaykv.model.text.tokenizer_export import (
    EXPORT_FORMAT,
    ExportError,
    TokenizerExport,
    cached_export,
)

log = logging.getLogger("relaykv.serve")


def chat_formatter(loaded: Any) -> ChatFormatter:
    """The chat formatter of a loaded model: its stored template, else the plain fallback."""
    config = loaded.config
    return ChatFormatter(loaded.tokenizer, find_chat_template(loaded.source), config.bos_token_id)


def generation_config_eos(source: str) -> list[int]:
    """`eos_token_id` of a model directory's generation_config.json (an id or a list), which
    is where HF models list every token that ends a reply (Gemma-3: <eos> and <end_of_turn>)."""
    path = Path(source) / "generation_config.json"
    if not path.is_file():
        return []
    value = json.loads(path.read_text()).get("eos_token_id")
    ids = value if isinstance(value, list) else [value]
    return [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]


def turn_stop_ids(tokenizer: Any, chat: ChatFormatter) -> list[int]:
    """Ids of the chat template's end-of-turn tokens (`TemplateSource.stop_tokens`)."""
    model = getattr(tokenizer, "model", None)
    if chat.source is None or model is None or not hasattr(model, "token_to_id"):
        return []
    ids = [model.token_to_id(text) for text in chat.source.stop_tokens]
    return [i for i in ids if i is not None]


def tokenizer_export(loaded: Any, chat: ChatFormatter) -> TokenizerExport:
    return TokenizerExport(
        loaded.tokenizer, chat, loaded.config.max_position_embeddings or 0, loaded.source
    )


def _tokenizer_digest(tokenizer: Any) -> str | None:
    """sha256 of a `tokenizers` tokenizer's JSON (about 0.2 s for Gemma's 262k vocabulary)."""
    import hashlib

    model = getattr(tokenizer, "model", None)
    if model is None or not hasattr(model, "to_str"):
        return None
    return hashlib.sha256(model.to_str().encode()).hexdigest()


def serving_tokenizer_dir(loaded: Any, chat: ChatFormatter, progress: bool) -> str | None:
    """The model's tokenizer as a Hugging Face directory in relaykv's cache directory
    (written once per model file), for clients that need one (`--tokenizer DIR`)."""
    from relaykv import __version__
    from relaykv.model.loading.packaged import cache_dir

    if loaded.tokenizer is None:
        return None
    source = Path(loaded.source)
    key = {
        "source": str(source.resolve()) if source.exists() else loaded.source,
        "mtime": source.stat().st_mtime if source.is_file() else None,
        "relaykv": __version__,
        "format": EXPORT_FORMAT,
        "template": chat.source.template if chat.source is not None else None,
        # The tokenizer's own content, so a fix in how relaykv builds it (e.g. Gemma's
        # newline tokens no longer special) rewrites a directory exported before.
        "tokenizer": _tokenizer_digest(loaded.tokenizer),
    }
    try:
        root = cache_dir() / "tokenizers" / loaded.name
        return str(cached_export(tokenizer_export(loaded, chat), root, key))
    except (ExportError, OSError) as exc:  # the server runs without it; the summary says why
        log.warning("tokenizer export skipped: %s", exc)
        return None
