"""The cache salt relaykv keys a vLLM request's blocks under: vLLM's `cache_salt` plus every
other input vLLM folds into its block hashes (a LoRA adapter, multimodal items, prompt
embeddings).

vLLM hashes these "extra keys" into each block (`generate_block_hash_extra_keys`), so two
requests with equal token ids but different adapters or images never share a block.
relaykv's keys cover the token ids and one salt (docs/design.md §2); without this, such
requests would share relaykv's cached blocks and read each other's KV. The extras are
folded into the salt of the request's first block, which is conservative: a LoRA request
shares only with requests of the same adapter (as in vLLM), and a multimodal or
prompt-embeds request only with requests carrying the same items at the same positions
(vLLM can still share the text blocks before the first item; relaykv recomputes them).
A request with no extras keeps its `cache_salt` unchanged, so keys stay those of relaykv's
own engine and of a P/D peer; the one exception is a `cache_salt` that itself begins with
the marker of a derived salt (vLLM's HTTP servers refuse its NUL; its Python API does not),
which is derived as well, so no request without extras can name an extras request's blocks.
"""

from __future__ import annotations

import hashlib
from typing import Any

from vllm.v1.request import Request
from vllm.v1.utils import tensor_data

# Every derived salt begins with this marker, and so does every salt given out for a
# `cache_salt` that begins with it: a salt chosen by a client never equals a derived one
# (an unsalted LoRA request's, say, whose digest anyone knowing the adapter can compute). The
# digest covers the request's own `cache_salt`: a derived salt reaches another tenant's
# salted blocks only by knowing that tenant's salt.
_MARKER = "\x00relaykv-vllm-extra-keys:"


def _extras(request: Request) -> list[Any]:
    extras: list[Any] = []
    lora = request.lora_request
    if lora:
        extras.append(("lora", lora.lora_name, lora.lora_path))
    for feature in request.mm_features or ():
        position = feature.mm_position
        extras.append(("mm", feature.identifier, position.offset, position.length))
    embeds = request.prompt_embeds
    if embeds is not None:
        extras.append(("prompt_embeds", hashlib.sha256(tensor_data(embeds)).hexdigest()))
    return extras


def request_salt(request: Request) -> str | None:
    """The salt relaykv hashes into `request`'s first block (see the module docstring)."""
    extras = _extras(request)
    salt = request.cache_salt or None  # vLLM hashes no salt for an empty one either
    if not extras and (salt is None or not salt.startswith(_MARKER)):
        return salt
    material = repr((salt, extras)).encode()
    return _MARKER + hashlib.sha256(material).hexdigest()
