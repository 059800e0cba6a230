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

import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from relaykv.engine import Executor
from relaykv.kvcache import Geometry
from relaykv.model.text.served_text import (
    chat_formatter,
    generation_config_eos,
    serving_tokenizer_dir,
    turn_stop_ids,
)
from relaykv.serve.assembly.model_info import ModelInfo
from relaykv.serve.assembly.options import EngineOptions, OptionError


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
