"""vLLM's extra endpoints (tokenize, render, load, deep health) and the SGLang bootstrap refusal.

The reference: the ids the generation endpoints themselves report (`return_token_ids`), so a
router tokenizing through these endpoints sees exactly what the engine computes on.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from ..harness import API_KEY, CharTokenizer, ServerThread

MODEL = "reference"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def test_tokenize_and_render_give_the_ids_completions_computes_on(http: httpx.Client) -> None:
    prompt = "the quick brown fox"
    done = http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2, "return_token_ids": True},
    ).json()
    used = done["choices"][0]["prompt_token_ids"]
    tok = http.post("/tokenize", json={"model": MODEL, "prompt": prompt}).json()
    assert tok == {"count": len(used), "max_model_len": 512, "tokens": used, "token_strs": None}
    render = http.post("/v1/completions/render", json={"model": MODEL, "prompt": prompt})
    assert render.status_code == 200
    [rendered] = render.json()
    assert rendered["token_ids"] == used
    assert rendered["model"] == MODEL and rendered["request_id"].startswith("cmpl-")
    assert rendered["sampling_params"]["max_tokens"] == 16  # OpenAI's default, as generation
    assert rendered["kv_transfer_params"] is None and rendered["priority"] == 0


def test_chat_tokenize_and_render_match_chat_generation(http: httpx.Client) -> None:
    done = http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": CHAT, "max_tokens": 2, "return_token_ids": True},
    ).json()
    used = done["choices"][0]["prompt_token_ids"]
    tok = http.post("/tokenize", json={"messages": CHAT, "return_token_strs": True}).json()
    assert tok["tokens"] == used and tok["count"] == len(used)
    assert "".join(tok["token_strs"]) == CharTokenizer().decode(used)
    render = http.post(
        "/v1/chat/completions/render",
        json={"model": MODEL, "messages": CHAT, "max_completion_tokens": 7, "stream": True},
    ).json()
    assert render["token_ids"] == used and render["stream"] is True
    assert render["sampling_params"]["max_tokens"] == 7


def test_detokenize_round_trips(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": "Hello, world"}).json()["tokens"]
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "Hello, world"}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": False}, "add_special_tokens"),
        ("/tokenize", {"messages": CHAT, "add_special_tokens": True}, "add_special_tokens"),
        ("/tokenize", {"messages": CHAT, "continue_final_message": True}, "continue_final_message"),
        ("/v1/completions/render", {"prompt": "x" * 600, "max_tokens": 1}, "prompt"),
        ("/v1/completions/render", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions/render", {"prompt": "hi", "n": 2}, "n"),
        ("/v1/chat/completions/render", {"messages": []}, "messages"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    http: httpx.Client, path: str, body: dict, param: str
) -> None:
    resp = http.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_unknown_model_is_404(http: httpx.Client) -> None:
    for path in ("/tokenize", "/v1/completions/render"):
        resp = http.post(path, json={"model": "other", "prompt": "hi"})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


def test_api_key_gates_the_computing_routes(server: ServerThread) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as anon:
        for method, path in (
            ("POST", "/tokenize"),
            ("POST", "/detokenize"),
            ("POST", "/v1/completions/render"),
        ):
            assert anon.request(method, path, json={}).status_code == 401, path
        # like /health and /metrics (vllm-router's health checker sends no key)
        assert anon.get("/get_load").json() == {"load": 0}
        assert anon.get("/health_generate").json() == {"status": "ok"}


def test_get_load_counts_requests_in_flight(server: ServerThread, http: httpx.Client) -> None:
    server.executor.delay = 0.05

    def send() -> None:
        http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 30})

    senders = [threading.Thread(target=send) for _ in range(3)]
    for t in senders:
        t.start()
    deadline = time.monotonic() + 5
    seen = 0
    while time.monotonic() < deadline and seen < 3:
        seen = max(seen, http.get("/get_load").json()["load"])
    server.executor.delay = 0.0
    for t in senders:
        t.join()
    assert seen == 3
    assert http.get("/get_load").json() == {"load": 0}


def test_health_generate_steps_the_model(server: ServerThread, http: httpx.Client) -> None:
    server.app.state.relaykv_health_check = None  # forget an earlier test's check
    steps = server.served.engine.metrics.num_steps
    assert http.get("/health_generate").json() == {"status": "ok"}
    assert server.served.engine.metrics.num_steps > steps  # a real forward ran
    steps = server.served.engine.metrics.num_steps
    assert http.get("/health_generate").status_code == 200
    assert server.served.engine.metrics.num_steps == steps  # reused within a second


SGLANG_FIELDS = {"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 42}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hello", "max_tokens": 4}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "stream": True}),
        ("/v1/completions/render", {"prompt": "hello"}),
    ],
)
def test_sglang_bootstrap_requests_are_refused_before_anything_runs(
    server: ServerThread, http: httpx.Client, path: str, body: dict
) -> None:
    metrics = server.served.engine.metrics
    before = (metrics.prompt_tokens, metrics.num_steps)
    resp = http.post(path, json={**body, **SGLANG_FIELDS})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "unsupported_pd_mode" and error["param"] == "bootstrap_room"
    assert "SGLang's bootstrap P/D mode" in error["message"]
    assert "vllm-router" in error["message"]
    assert (metrics.prompt_tokens, metrics.num_steps) == before
    # null fields (a client library's defaults) are not the bootstrap mode
    nulls = dict.fromkeys(SGLANG_FIELDS)
    assert http.post(path, json={**body, **nulls, "stream": False}).status_code == 200


def test_health_generate_is_503_while_draining() -> None:
    from ..harness import reference_served

    srv = ServerThread(reference_served(), api_key=None)
    try:
        assert httpx.get(f"{srv.url}/health_generate", timeout=10).status_code == 200
        srv.app.state.relaykv.draining = True
        resp = httpx.get(f"{srv.url}/health_generate", timeout=10)
        assert resp.status_code == 503
        assert httpx.get(f"{srv.url}/get_load", timeout=10).status_code == 200
    finally:
        srv.app.state.relaykv.draining = False
        srv.stop()


def test_api_key_is_accepted(server: ServerThread) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    resp = httpx.post(f"{server.url}/tokenize", json={"prompt": "a"}, headers=headers)
    assert resp.status_code == 200


def test_bootstrap_words_inside_a_prompt_are_not_the_bootstrap_mode(http: httpx.Client) -> None:
    body = {"prompt": 'say "bootstrap_room": 1', "max_tokens": 2, "bootstrap_extra": 1}
    assert http.post("/v1/completions", json=body).status_code == 200
