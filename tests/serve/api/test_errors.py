"""Every bad input gets an OpenAI-style error with the right status and changes nothing."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.engine.reference_executor import reference_generate

from ..harness import API_KEY, HYBRID, ServerThread, reference_served

MODEL = "reference"
GOOD = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def bare() -> Iterator[ServerThread]:
    """A server whose model has no tokenizer (token ids only) and no API key."""
    srv = ServerThread(reference_served(tokenizer=False), api_key=None)
    yield srv
    srv.stop()


def check_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


COMPLETION_CASES = [
    ({**GOOD, "max_tokens": "3"}, "max_tokens"),
    ({**GOOD, "max_tokens": 3.0}, "max_tokens"),
    ({**GOOD, "max_tokens": True}, "max_tokens"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "stop": [1]}, "stop"),
    ({**GOOD, "stream_options": {"include_usage": "x"}}, "stream_options"),
    ({**GOOD, "prompt": [1, "a"]}, "prompt"),
    ({**GOOD, "prompt": [1, 2.5]}, "prompt"),
    ({**GOOD, "prompt": [1, True]}, "prompt"),
    ({**GOOD, "prompt": [1, -1]}, "prompt"),
    ({**GOOD, "prompt": [1, 101]}, "prompt"),
    ({**GOOD, "prompt": []}, "prompt"),
    ({**GOOD, "prompt": ""}, "prompt"),
    ({**GOOD, "prompt": ["a", "b"]}, "prompt"),
    ({**GOOD, "prompt": [[1], [2]]}, "prompt"),
    ({**GOOD, "prompt": {"text": "a"}}, "prompt"),
    ({"model": MODEL, "max_tokens": 3}, "prompt"),
    ({**GOOD, "prompt": [1] * 512}, "prompt"),  # >= max_model_len (512)
    ({**GOOD, "prompt": [1] * 500, "max_tokens": 13}, "max_tokens"),
    ({**GOOD, "max_tokens": 0}, "max_tokens"),
    ({**GOOD, "max_tokens": -5}, "max_tokens"),
    ({**GOOD, "n": 2}, "n"),
    ({**GOOD, "n": 0}, "n"),
    ({**GOOD, "best_of": 3}, "best_of"),
    ({**GOOD, "echo": True}, "echo"),
    ({**GOOD, "suffix": "x"}, "suffix"),
    ({**GOOD, "presence_penalty": 0.5}, "presence_penalty"),
    ({**GOOD, "logit_bias": {"5": 1.0}}, "logit_bias"),
    ({**GOOD, "logprobs": 21}, "logprobs"),
    ({**GOOD, "logprobs": -1}, "logprobs"),
    ({**GOOD, "top_p": 0}, "top_p"),
    ({**GOOD, "temperature": -1}, "temperature"),
    ({**GOOD, "top_k": -2}, "top_k"),
    ({**GOOD, "min_tokens": 4}, "min_tokens"),
    ({**GOOD, "stop_token_ids": [500]}, "stop_token_ids"),
    ({**GOOD, "stop": [""]}, "stop"),
]


@pytest.mark.parametrize(("body", "param"), COMPLETION_CASES)
def test_bad_completion_requests(http: httpx.Client, body: dict, param: str) -> None:
    check_error(http.post("/v1/completions", json=body), 400, param)


CHAT_CASES = [
    ({**CHAT, "messages": []}, "messages"),
    ({**CHAT, "messages": "hi"}, "messages"),
    ({**CHAT, "messages": [{"content": "no role"}]}, "messages"),
    ({**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages"),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({**CHAT, "max_completion_tokens": 0}, "max_tokens"),
    ({**CHAT, "n": 3}, "n"),
    ({**CHAT, "tools": [{"type": "function"}]}, "tools"),
    ({**CHAT, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_CASES)
def test_bad_chat_requests(http: httpx.Client, body: dict, param: str) -> None:
    check_error(http.post("/v1/chat/completions", json=body), 400, param)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_json_and_non_objects(http: httpx.Client, path: str) -> None:
    headers = {"Content-Type": "application/json"}
    err = check_error(
        http.post(path, content=b'{"model": "reference", "prompt": [1,', headers=headers), 400
    )
    assert "malformed JSON" in err["message"]
    check_error(http.post(path, content=b"[1, 2]", headers=headers), 400)
    check_error(http.post(path, content=b"\xff\xfe", headers=headers), 400)


# Raw bodies (Python's json module accepts NaN/Infinity and parses 1e309 to inf; "\\ud800"
# decodes to a lone surrogate): each is a 400 naming the field, never a 500.
RAW_CASES = [
    ("/v1/completions", b'{"prompt": [1, 2], "temperature": Infinity}', "temperature"),
    ("/v1/completions", b'{"prompt": [1, 2], "temperature": NaN}', "temperature"),
    ("/v1/completions", b'{"prompt": [1, 2], "top_p": 1e309}', "top_p"),
    ("/v1/completions", b'{"prompt": [1, 2], "temperature": -Infinity}', "temperature"),
    ("/v1/completions", b'{"prompt": [1, 2], "kv_transfer_params": {"x": NaN}}', None),
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", b'{"prompt": ["\\udfff"]}', "prompt"),
    ("/v1/completions", b'{"prompt": [1], "stop": ["\\ud800"]}', "stop"),
    ("/v1/completions", b'{"prompt": [1], "user": "\\ud800"}', "user"),
    ("/v1/completions", b'{"prompt": [1], "\\ud800": 1}', None),
    ("/v1/completions", b'{"prompt": [1], "seed": 18446744073709551616}', "seed"),
    ("/v1/completions", b'{"prompt": [1], "top_k": 1000000000}', "top_k"),
    ("/v1/completions", b'{"prompt": [1], "max_tokens": 1e400}', "max_tokens"),
    ("/v1/completions", b'{"prompt": [1], "max_tokens": 100000000000000000000000}', "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "\\udc00", "content": "x"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
     b'"temperature": Infinity}', "temperature"),
]


@pytest.mark.parametrize(("path", "raw", "param"), RAW_CASES)
def test_non_finite_numbers_and_invalid_strings(
    http: httpx.Client, path: str, raw: bytes, param: str | None
) -> None:
    r = http.post(path, content=raw, headers={"Content-Type": "application/json"})
    error = check_error(r, 400, param)
    if param is not None:
        assert param in error["message"] or param == "messages"


def test_unknown_model_is_404(http: httpx.Client) -> None:
    err = check_error(http.post("/v1/completions", json={**GOOD, "model": "gpt-5"}), 404, "model")
    assert err["code"] == "model_not_found"
    check_error(http.post("/v1/chat/completions", json={**CHAT, "model": "x"}), 404, "model")
    # The model field may be left out: the one served model is meant.
    assert http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}).status_code == 200


def test_unknown_route_and_method(http: httpx.Client) -> None:
    check_error(http.get("/v1/nothing"), 404)
    check_error(http.get("/v1/completions"), 405)


def test_api_key(server: ServerThread) -> None:
    body = GOOD
    with httpx.Client(base_url=server.url, timeout=10) as c:
        err = check_error(c.post("/v1/completions", json=body), 401)
        assert err["code"] == "invalid_api_key"
        check_error(
            c.post("/v1/completions", json=body, headers={"Authorization": "Bearer no"}), 401
        )
        check_error(c.post("/v1/completions", json=body, headers={"Authorization": API_KEY}), 401)
        check_error(c.get("/v1/models"), 401)
        weird = {"Authorization": b"Bearer \xff\xfe"}
        check_error(c.post("/v1/completions", json=body, headers=weird), 401)
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 200
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt=[1, 2], max_tokens=1)


def test_openai_client_sees_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2, n=2)
    assert err.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=[1, 2], max_tokens=2)


def test_no_tokenizer_refuses_text(bare: ServerThread) -> None:
    with httpx.Client(base_url=bare.url, timeout=10) as c:
        err = check_error(c.post("/v1/completions", json={**GOOD, "prompt": "text"}), 400, "prompt")
        assert "tokenizer" in err["message"]
        check_error(c.post("/v1/completions", json={**GOOD, "stop": "x"}), 400, "stop")
        check_error(c.post("/v1/chat/completions", json=CHAT), 400, "messages")
        # Token ids work, and without an API key nothing needs a header.
        r = c.post("/v1/completions", json={**GOOD, "return_token_ids": True, "logprobs": 1})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["token_ids"] == reference_generate(HYBRID, [5, 6, 7], 3)
        assert choice["text"] == ""
        assert choice["logprobs"]["tokens"][0] == f"token_id:{choice['token_ids'][0]}"
    assert bare.idle()


async def test_bad_requests_do_not_disturb_a_stream(server: ServerThread) -> None:
    """A long stream stays exact while a barrage of bad requests hits the server."""
    server.executor.delay = 0.01
    prompt = [random.Random(9).randrange(1, 96) for _ in range(40)]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as c:
        aclient = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, http_client=c
        )

        finished: dict[str, float] = {}

        async def stream() -> list[int]:
            tokens: list[int] = []
            chunks = await aclient.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=200,
                temperature=0,
                stream=True,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )
            async for chunk in chunks:
                tokens += chunk.choices[0].model_extra["token_ids"]
            finished["stream"] = time.monotonic()
            return tokens

        async def barrage() -> list[int]:
            statuses = []
            await asyncio.sleep(0.05)
            for i in range(1):
                for body, _ in COMPLETION_CASES:
                    r = await c.post("/v1/completions", json=body)
                    statuses.append(r.status_code)
                r = await c.post(
                    "/v1/completions",
                    content=b"{nope",
                    headers={"Content-Type": "application/json"},
                )
                statuses.append(r.status_code)
                r = await c.post("/v1/completions", json={**GOOD, "model": f"m{i}"})
                statuses.append(r.status_code)
            finished["barrage"] = time.monotonic()
            return statuses

        tokens, statuses = await asyncio.gather(stream(), barrage())
    assert tokens == reference_generate(HYBRID, prompt, 200)
    assert set(statuses) == {400, 404}
    assert finished["barrage"] < finished["stream"]  # they really overlapped
    assert server.served.engine.metrics.requests_finished.get("abort", 0) == 0
