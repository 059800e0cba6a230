"""`GET /steps`: the engine's recent steps (engine/step_log.py) over HTTP, behind the API key."""

from __future__ import annotations

import httpx

from ..harness import ServerThread


def test_steps_lists_the_engine_steps_of_a_request(
    server: ServerThread, http: httpx.Client
) -> None:
    start = http.get("/steps").json()["now"]
    done = http.post("/v1/completions", json={"prompt": "abcdef", "max_tokens": 3})
    assert done.status_code == 200
    body = http.get("/steps", params={"since": start}).json()
    steps = body["steps"]
    assert steps and all(start <= s["end"] <= body["now"] for s in steps)
    kinds = [w["kind"] for s in steps for w in s["work"]]
    assert kinds == ["prefill", "decode", "decode"]  # one request, alone on the engine
    assert len({w["request_id"] for s in steps for w in s["work"]}) == 1
    assert http.get("/steps", params={"since": body["now"]}).json()["steps"] == []
    with httpx.Client(base_url=server.url, timeout=30) as anon:
        assert anon.get("/steps").status_code == 401  # it lists the requests served
