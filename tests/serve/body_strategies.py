"""Hypothesis strategies for request bodies: plausible fields mixed with hostile values.

Each body is a JSON object of the OpenAI fields (each present or not) whose values are drawn
from what a client means to send (token ids, short texts, small counts) and from what breaks
naive servers: non-finite numbers (written as the `NaN` / `Infinity` literals Python's JSON
accepts, or `1e309`), integers past 64 bits, lone surrogates, wrong types, nesting. Some
bodies are not objects or not JSON at all. `encode` writes the bytes a client would send.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HOSTILE_NUMBERS = [
    float("inf"),
    float("-inf"),
    float("nan"),
    -0.0,
    5e-324,
    1e308,
    2**63,
    2**64,
    2**64 - 1,
    -(2**63) - 1,
    10**30,
    -1,
    0,
    1,
    1e-300,
]
HOSTILE_TEXTS = [
    "\ud800",
    "a\udfffb",
    "\udbff\udc00",
    "",
    "\x00",
    "caf\u00e9",
    "\U0001f642",
    "x" * 300,
]

numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(HOSTILE_NUMBERS),
)
texts = st.one_of(st.text(max_size=12), st.sampled_from(HOSTILE_TEXTS))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
anything = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
small_ints = st.integers(-2, 12)
token_ids = st.lists(st.one_of(st.integers(0, 120), numbers), min_size=0, max_size=12)
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), texts)},
    optional={
        "content": st.one_of(
            texts,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2),
            anything,
        )
    },
)


def _field(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(plausible, plausible, anything)


SAMPLING = {
    "model": _field(st.sampled_from(["reference", "other"])),
    "max_tokens": _field(small_ints),
    "min_tokens": _field(small_ints),
    "temperature": _field(st.floats(0, 2)),
    "top_p": _field(st.floats(0, 1)),
    "top_k": _field(st.integers(-2, 200)),
    "seed": _field(st.integers(-(2**64), 2**65)),
    "stop": _field(st.one_of(texts, st.lists(texts, max_size=2))),
    "stop_token_ids": _field(st.lists(st.integers(-1, 120), max_size=3)),
    "ignore_eos": _field(st.booleans()),
    "n": _field(st.integers(0, 2)),
    "stream": _field(st.booleans()),
    "stream_options": _field(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "cache_salt": _field(texts),
    "return_token_ids": _field(st.booleans()),
    "logit_bias": _field(st.dictionaries(texts, numbers, max_size=2)),
    "presence_penalty": _field(numbers),
    "kv_transfer_params": _field(st.dictionaries(texts, anything, max_size=2)),
}
COMPLETION = {
    **SAMPLING,
    "prompt": _field(st.one_of(token_ids, texts, st.lists(token_ids, max_size=2))),
    "logprobs": _field(st.integers(-1, 21)),
    "echo": _field(st.booleans()),
}
CHAT = {
    **SAMPLING,
    "messages": _field(st.lists(message, max_size=3)),
    "max_completion_tokens": _field(small_ints),
    "logprobs": _field(st.booleans()),
    "top_logprobs": _field(st.integers(-1, 21)),
    "chat_template_kwargs": _field(st.dictionaries(texts, anything, max_size=2)),
    "response_format": _field(st.fixed_dictionaries({"type": texts})),
}


def bodies(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    objects = st.fixed_dictionaries({}, optional=fields).flatmap(
        lambda body: st.dictionaries(texts, anything, max_size=2).map(
            lambda extra: {**extra, **body}
        )
    )
    return st.one_of(objects, objects, objects, objects, objects, objects, anything)


def encode(body: Any) -> bytes:
    """JSON as a client writes it: surrogates as `\\ud800` escapes, `NaN`/`Infinity` literals."""
    return json.dumps(body, ensure_ascii=True).encode()


requests = st.one_of(
    st.tuples(st.just("/v1/completions"), bodies(COMPLETION).map(encode)),
    st.tuples(st.just("/v1/chat/completions"), bodies(CHAT).map(encode)),
    st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), st.binary(max_size=40)),
)


def check_answer(status: int, text: str) -> None:
    """Never a 5xx; a stream always ends with [DONE] and carries no error event."""
    assert status < 500, (status, text[:500])
    if status == 200 and text.startswith("data:"):
        assert text.endswith("data: [DONE]\n\n"), text[-300:]
        assert '"error"' not in text, text[:500]


def fuzz(client: httpx.Client, examples: int) -> None:
    """POST `examples` generated bodies through `client`, checking each answer."""

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same bodies on every run: a failure reproduces
        suppress_health_check=list(HealthCheck),
    )
    @given(requests)
    def one(request: tuple[str, bytes]) -> None:
        path, raw = request
        resp = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        check_answer(resp.status_code, resp.text)

    one()
