"""`GET /v1/kv_cache_info`: what a cache-aware router needs to know about this engine.

A router scores an engine with kvcache's own lookup over an index of the engine's blocks
(docs/routing.md), so it needs the engine's cache geometry (groups, block sizes, windows,
draft groups, EAGLE mode), its P/D role and policy, where its KV events are published, its
KV transfer `engine_id` (a router names it as a grant's destination, docs/security.md), a
per-process `instance` id (a restarted engine has a new one, so its old index is dropped),
and, at `/v1/kv_cache_info/tokenizer`, its tokenizer as `tokenizers` JSON (so text prompts
hash to the same blocks). Both sit under `/v1`, behind the API key.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, FastAPI

from relaykv.common.messages.geometry_json import geometry_json
from relaykv.engine.kv_events import ZmqEventPublisher
from relaykv.serve.assembly.engine_factory import ServedEngine

INSTANCE = uuid.uuid4().hex


def byte_tokenizer_json(offset: int) -> str:
    """The tiny-hybrid byte tokenizer (byte b -> id b + offset) as `tokenizers` JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {ch: _byte_of(ch) + offset for ch in alphabet}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return str(tok.to_str())


def _byte_of(ch: str) -> int:
    # GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest to 256 + n.
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    code = ord(ch)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def tokenizer_json(served: ServedEngine) -> dict[str, Any] | None:
    """`{"json": tokenizers JSON, "bos_token_id": id | None, "add_bos": bool}` or None."""
    tokenizer = served.tokenizer
    if tokenizer is None:
        return None
    offset = getattr(tokenizer, "OFFSET", None)
    if offset is not None and type(tokenizer).__name__ == "ByteTokenizer":
        return {
            "json": byte_tokenizer_json(offset),
            "bos_token_id": tokenizer.BOS,  # type: ignore[attr-defined]
            "add_bos": True,
        }
    model = getattr(tokenizer, "model", None)
    if model is None or not hasattr(model, "to_str"):
        return None
    return {
        "json": model.to_str(),
        "bos_token_id": getattr(tokenizer, "bos_token_id", None),
        "add_bos": bool(getattr(tokenizer, "add_bos", False)),
    }


def install_kv_cache_info(
    app: FastAPI, served: ServedEngine, publisher: ZmqEventPublisher | None
) -> None:
    manager = served.engine.manager
    cached_tokenizer: list[dict[str, Any] | None] = []

    router = APIRouter()

    @router.get("/v1/kv_cache_info/tokenizer")
    async def kv_cache_tokenizer() -> dict[str, Any] | None:
        if not cached_tokenizer:
            cached_tokenizer.append(tokenizer_json(served))
        return cached_tokenizer[0]

    @router.get("/v1/kv_cache_info")
    async def kv_cache_info() -> dict[str, Any]:
        return {
            "instance": INSTANCE,
            "model": served.served_model_name,
            "role": served.options.role,
            "pd_policy": served.options.pd_policy,
            "sibling_reach": manager.sibling_reach,
            "geometry": geometry_json(manager.geometry),
            "num_blocks": manager.pool.num_usable,
            "kv_events": publisher.describe() if publisher is not None else None,
            # the KV transfer identity a router names as a grant's destination (P/D only)
            "engine_id": getattr(served.engine.connector, "engine_id", None),
        }

    app.include_router(router)
