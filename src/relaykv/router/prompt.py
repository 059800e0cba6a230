"""A request's prompt tokens as the router scores them (docs/routing.md).

`PromptReader.read` turns a request body into a `Prompt`: a completion's token ids as sent,
its text encoded with the engine's own tokenizer (fetched once from
`/v1/kv_cache_info/tokenizer`, loaded with `tokenizers`), or chat messages through an engine's
`POST /tokenize` (its own chat template; one round trip). When none of these works the request
is routed on load alone (`None`) and the engine answers whatever is wrong with it.

A `Prompt` is hashed once per engine geometry, on first use, and the result is shared by every
engine of that geometry and by both of the request's decisions (decode, then prefill);
`chains`, the router's memo of recently hashed prefixes, makes a prompt that shares a system
prompt with recent ones hash only the rest (`kvcache.hashing.PrefixChains`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx

from relaykv.kvcache import CacheRequest
from relaykv.kvcache.accel import int32_bytes
from relaykv.kvcache.hashing import PrefixChains
from relaykv.router.backends import Backend, BackendPool
from relaykv.router.holders import KeyHolders, PromptCounts
from relaykv.router.index import EngineIndex


@dataclass(slots=True)
class Prompt:
    """A request's prompt tokens, hashed once per geometry and shared by its prefill and
    decode decisions; `chains` is the router's memo of recently hashed prefixes."""

    # The ids: where the intake converted a body's list (`ids`), a view of those bytes, so a
    # request's prompt holds no 65k-item list of Python ints of its own (docs/routing.md
    # "Cost"; the body's list goes with the body).
    tokens: Sequence[int]
    salt: str | None = None
    chains: PrefixChains | None = None
    ids: bytes | None = None  # `tokens` as little-endian int32 bytes, when the intake has them
    _requests: dict[Any, CacheRequest] = field(default_factory=dict)
    _counts: dict[Any, PromptCounts] = field(default_factory=dict)
    # The geometry asked for last and its request: engines of one role share one geometry
    # object, and a geometry's (dataclass) hash is recomputed on every dict lookup.
    _last: tuple[Any, CacheRequest | None] = (None, None)

    def counts(self, holders: KeyHolders, index: EngineIndex, group: int) -> PromptCounts:
        """Per engine slot, the prompt's keys held in `group` (one pass for all engines)."""
        req = self.request_for(index)  # one per geometry: it stands for the geometry here
        key = (holders, req, group)
        found = self._counts.get(key)
        if found is None:
            found = self._counts[key] = PromptCounts(holders, group, req.keys(group))
        return found

    def counts_for(self, index: EngineIndex) -> Callable[[int], PromptCounts] | None:
        """`index`'s view of the prompt's counts in its role's holders map (None: it has
        none), as `EngineIndex.usable_hit` and `hit_bound` take it."""
        if index.holders is None:
            return None
        return partial(self.counts, index.holders, index)

    def recount(self) -> None:
        """Forget the counts: the holders map changed (a new decision begins)."""
        self._counts.clear()

    def request_for(self, index: EngineIndex) -> CacheRequest:
        """One hashed request per geometry, shared by every engine that has it."""
        key = index.geometry
        last, req = self._last
        if key is last and req is not None:
            return req
        req = self._requests.get(key)
        if req is None:
            req = self._requests[key] = index.request(
                self.tokens, self.salt, chains=self.chains, token_bytes=self.ids
            )
        self._last = (key, req)
        return req


def _int32_view(ids: bytes, raw: list[int]) -> Sequence[int]:
    """The ids in `ids` (little-endian int32) as a sequence of ints without a copy where
    the host is little-endian, else the body's list `raw` they were converted from."""
    view = memoryview(ids)
    if sys.byteorder == "little" and view.cast("i").itemsize == 4:
        return view.cast("i")
    return raw


def _token_ids(raw: list[Any]) -> bytes | None:
    """A body's `prompt` list as little-endian int32 bytes, if it is token ids the router can
    hash: exact ints within int32 (one C pass where kvcache's accelerator is built; the
    request is hashed from these bytes, so the list is converted once). Anything else
    (None) is routed on load alone, and the engine answers it (a 400 for ids it cannot
    take)."""
    try:
        return int32_bytes(raw, strict=True)
    except (TypeError, OverflowError):
        return None


class PromptReader:
    """Prompt tokens from request bodies; only cache-aware routing needs them (`enabled`)."""

    def __init__(self, enabled: bool, api_key: str | None = None) -> None:
        self.enabled = enabled
        self.api_key = api_key
        self.chains = PrefixChains()  # hash chains of recent prompts' shared prefixes
        self._tokenizer: Any = None
        self._tokenizer_info: dict[str, Any] | None = None

    async def read(
        self,
        client: httpx.AsyncClient | None,
        pool: BackendPool,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> Prompt | None:
        """The body's prompt tokens; chat messages through one of `pool`'s engines."""
        prompt = self.prompt(body)
        if prompt is None and client is not None and "messages" in body:
            prompt = await self.chat_prompt(client, pool, body, headers)
        return prompt

    def prompt(self, body: dict[str, Any]) -> Prompt | None:
        """A completion's prompt tokens: its ids, or its text through the engine's tokenizer."""
        if not self.enabled:
            return None
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
            raw = raw[0]
        if isinstance(raw, list) and raw:
            converted = _token_ids(raw)
            if converted is not None:
                return Prompt(_int32_view(converted, raw), salt, self.chains, converted)
            return None
        if isinstance(raw, str) and raw and self._tokenizer is not None:
            try:
                ids = self._tokenizer.encode(raw, add_special_tokens=True).ids
            except (TypeError, ValueError):  # e.g. a lone surrogate: the engine's 400 to give
                return None
            info = self._tokenizer_info or {}
            bos = info.get("bos_token_id")
            if info.get("add_bos") and bos is not None and (not ids or ids[0] != bos):
                ids = [bos, *ids]
            return Prompt(list(ids), salt, self.chains)
        return None

    async def chat_prompt(
        self,
        client: httpx.AsyncClient,
        pool: BackendPool,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> Prompt | None:
        """A chat request's prompt tokens from an engine's `POST /tokenize` (the engine
        applies its own chat template); None (load-only routing) when it cannot answer."""
        if not self.enabled or not isinstance(body.get("messages"), list):
            return None
        backend = pool.first_healthy()
        if backend is None:
            return None
        try:
            resp = await client.post(
                f"{backend.url}/tokenize", json=body, headers=headers, timeout=5.0
            )
            tokens = resp.json().get("tokens") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        if not isinstance(tokens, list) or not tokens or not all(type(t) is int for t in tokens):
            return None
        salt = body.get("cache_salt")
        return Prompt(tokens, salt if isinstance(salt, str) else None, self.chains)

    async def load_tokenizer(self, client: httpx.AsyncClient, backends: list[Backend]) -> None:
        """Fetch the engines' tokenizer once (the health tick calls this until it has one,
        or knows the engines have none: text prompts are then routed on load alone)."""
        if not self.enabled or self._tokenizer_info is not None:
            return
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        for b in backends:
            if not b.healthy:
                continue
            try:
                resp = await client.get(
                    f"{b.url}/v1/kv_cache_info/tokenizer", headers=auth, timeout=10.0
                )
                info = resp.json() if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(info, dict) and isinstance(info.get("json"), str):
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_str(info["json"])
                self._tokenizer_info = info
                return
            self._tokenizer_info = {}  # the engine has no tokenizer: text is load-only
            return
