"""/v1/chat/completions through the openai client (plain fallback template)."""

from __future__ import annotations

import openai

from relaykv.serve.chat_template import fallback_prompt
from tests.engine.reference_executor import reference_generate

from .harness import HYBRID, CharTokenizer, fake_logprob

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
    token_chunks = [c for c in chunks if c.choices]
    assert token_chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in token_chunks[1:])
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
