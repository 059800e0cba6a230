"""Draining (what SIGTERM starts): 503 for new requests, in-flight ones finish or are aborted
at the drain timeout, blocks freed, the server exits. The real signal is tested on a
`relaykv serve` subprocess in test_server_process.py."""

from __future__ import annotations

import httpx

from relaykv.kvcache import assert_consistent

from ..harness import API_KEY, ServerThread, reference_served

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_drain_timeout_aborts_what_is_left_and_frees_it() -> None:
    # 2 s: long enough that the 503 checks below run while the server still drains on a
    # loaded machine (0.3 s raced them), short of the ~4 s the request needs, so it is aborted.
    srv = ServerThread(reference_served(), drain_timeout=2.0)
    try:
        srv.executor.delay = 0.01
        body = {"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True, "stream": True}
        with (
            httpx.Client(base_url=srv.url, headers=AUTH, timeout=30) as c,
            c.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            srv.terminate()
            refused = httpx.post(
                f"{srv.url}/v1/completions", headers=AUTH, json={"prompt": [1], "max_tokens": 1}
            )
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "service_unavailable"
            assert httpx.get(f"{srv.url}/health").status_code == 503
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and '"finish_reason":"abort"' in rest[-2]
        srv.thread.join(10)
        assert not srv.thread.is_alive(), "the server did not exit after draining"
        engine = srv.served.engine
        assert engine.manager.pool.num_free == engine.manager.pool.num_usable
        assert not engine.has_unfinished()
        assert_consistent(engine.manager)
    finally:
        srv.stop()
