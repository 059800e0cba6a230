"""The router's prompt tokens equal the engine's: ids as sent, text through the exported
tokenizer (tiny-hybrid's byte tokenizer as `tokenizers` JSON), salt kept."""

from __future__ import annotations

import random
import sys

import pytest
from tokenizers import Tokenizer

import relaykv.kvcache.request as request_module
import relaykv.router.prompt as prompt_module
from relaykv.kvcache import preset
from relaykv.model.loading.tokenizer import ByteTokenizer
from relaykv.router.index import EngineIndex
from relaykv.router.prompt import Prompt
from relaykv.router.routing import Routing
from relaykv.serve.api.kv_cache_info import byte_tokenizer_json


def test_byte_tokenizer_export_encodes_like_the_engine() -> None:
    exported = Tokenizer.from_str(byte_tokenizer_json(ByteTokenizer.OFFSET))
    engine = ByteTokenizer()
    for text in ("hello world", " a  b\n\tc", "héllo ☃ 日本語", "x" * 300):
        assert [engine.BOS, *exported.encode(text).ids] == engine.encode(text)


def test_prompt_tokens_from_ids_text_and_salt() -> None:
    routing = Routing("cache-aware").prompts
    assert list(routing.prompt({"prompt": [5, 6, 7]}).tokens) == [5, 6, 7]  # type: ignore[union-attr]
    assert list(routing.prompt({"prompt": [[5, 6]]}).tokens) == [5, 6]  # type: ignore[union-attr]
    assert routing.prompt({"prompt": "hi"}) is None  # no tokenizer yet: load-only
    routing._tokenizer = Tokenizer.from_str(byte_tokenizer_json(ByteTokenizer.OFFSET))
    routing._tokenizer_info = {"bos_token_id": 1, "add_bos": True}
    prompt = routing.prompt({"prompt": "hé", "cache_salt": "tenant"})
    assert prompt is not None and prompt.tokens == ByteTokenizer().encode("hé")
    assert prompt.salt == "tenant"
    for body in (
        {"messages": [{"role": "user", "content": "x"}]},
        {"prompt": []},
        {"prompt": [1, "a"]},
        {"prompt": [True]},
        {"prompt": [1, 2.0]},
        {"prompt": [1, 2**31]},  # not an int32 id: load-only, the engine answers it
        {"prompt": [-(2**31) - 1]},
    ):
        assert routing.prompt(body) is None
    assert Routing("least-loaded").prompts.prompt({"prompt": [1, 2]}) is None


def test_a_bodys_ids_are_converted_once_and_hash_as_the_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The intake's strict check converts the ids; the request is hashed from those bytes
    # (docs/routing.md "Cost"), to the very keys the list gives.
    tokens = random.Random(5).choices(range(50_000), k=3000)
    index = EngineIndex(preset("gpt-oss-like"), "decode")
    expected = Prompt(tokens, "tenant").request_for(index)
    calls = []
    convert = prompt_module.int32_bytes

    def counted(raw: list[int], strict: bool = False) -> bytes:
        calls.append(strict)
        return convert(raw, strict)

    def refused(*args: object) -> bytes:
        raise AssertionError("the request converted the ids again")

    monkeypatch.setattr(prompt_module, "int32_bytes", counted)
    monkeypatch.setattr(request_module, "int32_bytes", refused)
    prompt = Routing("cache-aware").prompts.prompt({"prompt": tokens, "cache_salt": "tenant"})
    # The prompt keeps those bytes (viewed as ints), not the body's list.
    assert prompt is not None and list(prompt.tokens) == tokens and calls == [True]
    assert sys.byteorder != "little" or not isinstance(prompt.tokens, list)
    req = prompt.request_for(index)
    assert req.tokens.tolist() == tokens and prompt.ids == convert(tokens)
    assert req.hashes.hashes == expected.hashes.hashes
    assert [req.keys(g) for g in (0, 1)] == [expected.keys(g) for g in (0, 1)]


async def test_chat_prompt_through_the_engines_tokenize() -> None:
    import httpx

    from relaykv.router.backends import BackendPool

    seen: list[dict] = []

    def engine(request: httpx.Request) -> httpx.Response:
        import json

        seen.append(json.loads(request.content))
        if request.url.path != "/tokenize":
            return httpx.Response(404)
        if seen[-1].get("continue_final_message"):
            return httpx.Response(400, json={"error": {"message": "no"}})
        return httpx.Response(200, json={"tokens": [1, 9, 9, 4], "count": 4})

    pool = BackendPool("prefill", ["http://p0"])
    body = {"messages": [{"role": "user", "content": "hi"}], "cache_salt": "t"}
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        prompt = await Routing("cache-aware").prompts.chat_prompt(client, pool, body, {})
        assert prompt is not None and list(prompt.tokens) == [1, 9, 9, 4] and prompt.salt == "t"
        bad = {**body, "continue_final_message": True}
        assert await Routing("cache-aware").prompts.chat_prompt(client, pool, bad, {}) is None
        assert await Routing("least-loaded").prompts.chat_prompt(client, pool, body, {}) is None
        pool.backends[0].healthy = False
        assert await Routing("cache-aware").prompts.chat_prompt(client, pool, body, {}) is None
    assert seen[0]["messages"] == body["messages"]
