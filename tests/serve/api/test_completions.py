"""/v1/completions through the official openai client: exact tokens, usage, streaming."""

from __future__ import annotations

import random

import httpx
import openai
import pytest

from tests.engine.reference_executor import reference_generate

from ..harness import HYBRID, CharTokenizer, ServerThread, fake_logprob

MODEL = "reference"


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 96) for _ in range(n)]


def test_non_streaming_token_ids_match_the_reference(client: openai.OpenAI) -> None:
    prompt = ids(37, 1)
    resp = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=20,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = resp.choices[0]
    expected = reference_generate(HYBRID, prompt, 20)
    assert choice.model_extra["token_ids"] == expected
    assert choice.text == CharTokenizer().decode(expected)
    assert choice.finish_reason == "length"
    assert resp.object == "text_completion" and resp.model == MODEL
    assert resp.id.startswith("cmpl-")
    usage = resp.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (37, 20, 57)
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_streaming_with_usage(client: openai.OpenAI) -> None:
    prompt = ids(50, 2)
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    tokens: list[int] = []
    text, finish, usage, token_chunks = "", None, None, 0
    for chunk in stream:
        if chunk.choices:
            token_chunks += 1
            tokens += chunk.choices[0].model_extra["token_ids"]
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        else:
            usage = chunk.usage
    expected = reference_generate(HYBRID, prompt, 30)
    assert tokens == expected and text == CharTokenizer().decode(expected)
    assert finish == "length" and token_chunks >= 2
    assert usage is not None and usage.completion_tokens == 30 and usage.prompt_tokens == 50
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_string_and_single_element_list_prompts(client: openai.OpenAI) -> None:
    tok = CharTokenizer()
    text = "The quick brown fox jumps over the lazy dog"
    expected = reference_generate(HYBRID, tok.encode(text), 8)
    for prompt in (text, [text], tok.encode(text), [tok.encode(text)]):
        resp = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        assert resp.choices[0].model_extra["token_ids"] == expected, prompt
        assert resp.usage.prompt_tokens == len(text)


def test_cached_tokens_grow_for_a_shared_prefix(client: openai.OpenAI) -> None:
    x = ids(100, 3)

    def send(suffix: list[int], stream: bool) -> tuple[int, list[int]]:
        if not stream:
            r = client.completions.create(
                model=MODEL,
                prompt=x + suffix,
                max_tokens=4,
                temperature=0,
                extra_body={"return_token_ids": True},
            )
            return r.usage.prompt_tokens_details.cached_tokens, r.choices[0].model_extra[
                "token_ids"
            ]
        cached, out = -1, []
        for chunk in client.completions.create(
            model=MODEL,
            prompt=x + suffix,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        ):
            if chunk.choices:
                out += chunk.choices[0].model_extra["token_ids"]
            else:
                cached = chunk.usage.prompt_tokens_details.cached_tokens
        return cached, out

    # Same sequence as tests/engine: the first sibling pins the junction window (§6).
    assert send([1] * 9, False)[0] == 0
    assert send([9] * 9, True)[0] == 0
    cached, out = send([5, 5], True)
    assert cached == 100 and out == reference_generate(HYBRID, [*x, 5, 5], 4)
    cached, again = send([5, 5], False)
    assert cached == 100 and again == out


def test_stop_strings_stop_token_ids_and_min_tokens(client: openai.OpenAI) -> None:
    tok = CharTokenizer()
    prompt = ids(30, 4)
    full = reference_generate(HYBRID, prompt, 40)
    full_text = tok.decode(full)
    stop = full_text[12:14]
    resp = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=[stop, "\x00never"]
    )
    assert resp.choices[0].text == full_text[: full_text.find(stop)]
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].model_extra["stop_reason"] == stop

    target = full[6]
    resp = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=40,
        temperature=0,
        extra_body={"stop_token_ids": [target], "return_token_ids": True},
    )
    assert resp.choices[0].model_extra["token_ids"] == full[: full.index(target) + 1]
    assert resp.choices[0].model_extra["stop_reason"] == target

    later = full.index(target) + 1
    resp = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=40,
        temperature=0,
        extra_body={"stop_token_ids": [target], "min_tokens": later, "return_token_ids": True},
    )
    out = resp.choices[0].model_extra["token_ids"]
    assert len(out) > later - 1 and out == full[: len(out)]


def test_logprobs_completions_shape(client: openai.OpenAI) -> None:
    tok = CharTokenizer()
    prompt = ids(20, 5)
    expected = reference_generate(HYBRID, prompt, 6)
    resp = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2
    )
    lp = resp.choices[0].logprobs
    assert lp.tokens == [tok.decode([t]) for t in expected]
    assert lp.token_logprobs == [fake_logprob(t) for t in expected]
    assert lp.text_offset == list(range(6))  # one character per token
    for t, top in zip(expected, lp.top_logprobs, strict=True):
        assert top[tok.decode([t])] == fake_logprob(t) and len(top) >= 2
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, logprobs=0)
    assert all(len(top) == 1 for top in resp.choices[0].logprobs.top_logprobs)


def test_sampling_fields_are_accepted(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=MODEL,
        prompt=ids(10, 6),
        max_tokens=5,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        extra_body={"top_k": 20, "ignore_eos": True, "cache_salt": "tenant-a"},
    )
    assert resp.usage.completion_tokens == 5


def test_cache_salt_separates_prefix_caches(client: openai.OpenAI) -> None:
    prompt = ids(64, 7)

    def cached(salt: str | None) -> int:
        r = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=2,
            temperature=0,
            extra_body={"cache_salt": salt} if salt else {},
        )
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0
    assert cached("tenant-a") > 0


def test_kv_transfer_params_reach_the_engine(server: ServerThread, http: httpx.Client) -> None:
    # Accepted, but only a prefill engine answers with transfer parameters (where its KV is).
    params = {"note": "opaque to a colocated engine"}
    r = http.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": ids(12, 8),
            "max_tokens": 2,
            "kv_transfer_params": params,
        },
    )
    assert r.status_code == 200 and r.json().get("kv_transfer_params") is None
    r = http.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": ids(12, 8),
            "max_tokens": 2,
            "kv_transfer_params": {"do_remote_decode": True},
        },
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "kv_transfer_params"


def test_models_and_health(http: httpx.Client) -> None:
    card = http.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["owned_by"] == "relaykv"
    assert card["vocab_size"] == 101 and card["max_model_len"] == 512
    assert http.get("/health").status_code == 200


def test_models_retrieve_by_id(client: openai.OpenAI) -> None:
    """`client.models.retrieve(id)` (GET /v1/models/{id}): the card, or OpenAI's 404."""
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.owned_by == "relaykv"
    assert card.model_extra["max_model_len"] == 512
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4")
    assert err.value.body["code"] == "model_not_found"
