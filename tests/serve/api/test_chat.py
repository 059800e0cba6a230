"""/v1/chat/completions through the openai client (plain fallback template)."""

from __future__ import annotations

import json

import httpx
import openai

from relaykv.model.text.chat_template import fallback_prompt
from tests.engine.reference_executor import reference_generate

from ..harness import HYBRID, CharTokenizer, fake_logprob

MODEL = "reference"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a prime."},
]


def expected_ids(n: int, messages=MESSAGES) -> tuple[list[int], list[int]]:
    prompt = CharTokenizer().encode(fallback_prompt(messages))
    return prompt, reference_generate(HYBRID, prompt, n)


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    prompt, out = expected_ids(12)
    resp = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=12,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == CharTokenizer().decode(out)
    assert choice.model_extra["token_ids"] == out
    assert choice.model_extra["prompt_token_ids"] == prompt
    assert choice.finish_reason == "length" and resp.object == "chat.completion"
    assert resp.usage.prompt_tokens == len(prompt) and resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_streaming_role_on_first_chunk_and_usage(client: openai.OpenAI) -> None:
    _prompt, out = expected_ids(15)
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=15,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    opening, *token_chunks = [c for c in chunks if c.choices]
    assert opening.choices[0].delta.role == "assistant" and opening.choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in token_chunks)
    text = "".join(c.choices[0].delta.content or "" for c in token_chunks)
    assert text == CharTokenizer().decode(out)
    assert token_chunks[-1].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == 15
    # The conversation was sent just before: its prompt is cached (an identical resend hits).
    assert usage.prompt_tokens_details.cached_tokens > 0
    assert chunks[0].object == "chat.completion.chunk"


def test_chat_content_parts_and_max_tokens_precedence(client: openai.OpenAI) -> None:
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    _, out = expected_ids(3, [{"role": "user", "content": "a\nb"}])
    resp = client.chat.completions.create(
        model=MODEL, messages=parts, max_tokens=50, max_completion_tokens=3, temperature=0
    )
    assert resp.choices[0].message.content == CharTokenizer().decode(out)


def test_chat_logprobs(client: openai.OpenAI) -> None:
    _, out = expected_ids(4)
    resp = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = resp.choices[0].logprobs.content
    assert [c.logprob for c in content] == [fake_logprob(t) for t in out]
    assert all(len(c.top_logprobs) == 3 for c in content)
    assert content[0].token == CharTokenizer().decode([out[0]])


def _sse_events(raw: str) -> list[dict]:
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e.strip()]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_chat_stream_as_vllm_and_sglang_clients_read_it(http: httpx.Client) -> None:
    """vLLM's server opens a chat stream with a role-only chunk, then one chunk per token
    step. vLLM 0.33's client takes the opening chunk as metadata and the first chunk with
    `content` as the first token; SGLang's `bench_serving` counts chunks with non-empty
    content. Either way every token step is a chunk of its own: no inter-token gap is lost,
    even when a token decodes to the empty string (ids above 95 do here)."""
    n = 24
    _prompt, out = expected_ids(n)
    assert any(not CharTokenizer().decode([t]) for t in out), "the case needs empty-text tokens"
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_completion_tokens": n,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    events = _sse_events(http.post("/v1/chat/completions", json=body).text)
    opening, *steps, usage = events
    assert opening["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n
    # vLLM's rule: after the opening chunk, every chunk with `content` is one token step.
    vllm_tokens = [e for e in steps if "content" in e["choices"][0]["delta"]]
    assert len(vllm_tokens) == len(steps) == n  # one chunk per step (no speculation here)
    assert [e["choices"][0]["token_ids"] for e in steps] == [[t] for t in out]
    # SGLang's rule: chunks with non-empty content; exactly the tokens with text.
    sglang_tokens = [e for e in steps if e["choices"][0]["delta"].get("content")]
    assert len(sglang_tokens) == sum(1 for t in out if CharTokenizer().decode([t]))
    assert "".join(e["choices"][0]["delta"]["content"] for e in steps) == CharTokenizer().decode(
        out
    )
    assert steps[-1]["choices"][0]["finish_reason"] == "length"
