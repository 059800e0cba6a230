"""Loading a model for serving: target, tokenizer, chat template, EAGLE draft, KV geometry.

Uses the model layer's public API (`relaykv.model`, docs/model.md): `load_model(spec,
dtype)` for the target (tiny-hybrid, a packaged preset, an HF directory or a GGUF file),
`random_draft` / `load_eagle_checkpoint` / a preset's shipped `default_draft` for the
draft, `derive_layout` for the geometry
the runner will use, and `ModelRunner(model, num_blocks=..., ...)` as the executor, built
only once the factory knows the pool size. Stages show a progress bar (GGUF reads show
their own).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from relaykv.engine import Executor
from relaykv.kvcache import Geometry
from relaykv.serve.chat_template import ChatFormatter, find_chat_template
from relaykv.serve.model_info import ModelInfo
from relaykv.serve.options import EngineOptions, OptionError
from relaykv.serve.tokenizer_export import (
    EXPORT_FORMAT,
    ExportError,
    TokenizerExport,
    cached_export,
)

log = logging.getLogger("relaykv.serve")


def load_for_serving(
    options: EngineOptions,
    progress: bool = True,
    kv_buffer: Callable[[Geometry, int], Any] | None = None,
) -> tuple[ModelInfo, Geometry, Callable[[int], Executor]]:
    """The model, its KV geometry and a function building its runner for N pool blocks.

    `kv_buffer(geometry, num_blocks)`, when given, provides the runner's KV page memory (a
    decode engine's shared-memory buffer that the shm transport writes into directly)."""
    from relaykv.model import (
        ModelRunner,
        NoDefaultDraft,
        PackageNotInstalled,
        default_draft,
        derive_layout,
        load_eagle_checkpoint,
        load_model,
        random_draft,
    )

    started = time.monotonic()
    bar = tqdm(total=4, desc=f"loading {options.model}", unit="stage", disable=not progress)
    try:
        bar.set_postfix_str("weights")
        try:
            loaded = load_model(options.model, dtype=options.dtype)
        except PackageNotInstalled as exc:
            raise OptionError("--model", str(exc)) from None
        except (ValueError, FileNotFoundError, KeyError) as exc:
            raise OptionError("--model", str(exc)) from None
        bar.update()
        bar.set_postfix_str("tokenizer")
        config = loaded.config
        tokenizer = loaded.tokenizer
        chat = chat_formatter(loaded)
        eos = tuple(
            dict.fromkeys(
                [
                    *loaded.eos_token_ids,
                    *(getattr(tokenizer, "eos_token_ids", ()) or ()),
                    *generation_config_eos(loaded.source),
                    *turn_stop_ids(tokenizer, chat),
                ]
            )
        )
        bar.update()
        bar.set_postfix_str("draft")
        draft = None
        if options.speculative_tokens:
            if options.draft_model is None:
                # The preset's shipped draft (tiny-hybrid, gemma3-270m; docs/model.md).
                try:
                    draft = default_draft(options.model, config, loaded.model.dtype)
                except NoDefaultDraft as exc:
                    raise OptionError("--draft-model", str(exc)) from None
            elif options.draft_model == "random":
                draft = random_draft(config, seed=options.seed or 0, dtype=loaded.model.dtype)
            else:
                try:
                    draft = load_eagle_checkpoint(
                        str(options.draft_model), config, dtype=loaded.model.dtype
                    )
                except (ValueError, FileNotFoundError, KeyError) as exc:
                    raise OptionError("--draft-model", str(exc)) from None
        bar.update()
        bar.set_postfix_str("KV layout")
        shape = draft.attention_shape() if draft is not None else None
        layout = derive_layout(config, options.block_size, loaded.model.dtype, shape)
        bar.update()
    finally:
        bar.close()
    tokenizer_dir = serving_tokenizer_dir(loaded, chat, progress)
    params = sum(p.numel() for p in loaded.model.parameters())
    model = ModelInfo(
        name=loaded.name,
        source=loaded.source,
        vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        tokenizer=tokenizer,
        eos_token_ids=eos,
        bos_token_id=config.bos_token_id,
        chat=chat,
        tokenizer_dir=tokenizer_dir,
        description=f"{params / 1e6:.1f}M parameters, {options.dtype}, loaded in "
        f"{time.monotonic() - started:.1f} s",
    )

    def make_executor(num_blocks: int) -> Executor:
        return ModelRunner(
            loaded.model,
            num_blocks=num_blocks,
            block_size=options.block_size,
            draft=draft,
            num_speculative_tokens=options.speculative_tokens,
            seed=options.seed,
            kv_buffer=kv_buffer(layout.geometry, num_blocks) if kv_buffer else None,
        )

    return model, layout.geometry, make_executor


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
