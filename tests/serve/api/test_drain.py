"""Draining (what SIGTERM starts): 503 for new requests, in-flight ones finish or are aborted
at the drain timeout, blocks freed, the server exits. The real signal is tested on a
`relaykv serve` subprocess in test_server_process.py.

The in-flight request is held at the executor's step gate, so the drain cannot end before
the test has looked at it, on a machine however loaded; every wait ends on a condition."""

from __future__ import annotations

import threading

import httpx

from relaykv.kvcache import assert_consistent
from relaykv.serve.api.app import app_state

from ..harness import API_KEY, ServerThread, reference_served

AUTH = {"Authorization": f"Bearer {API_KEY}"}
DEADLINE_S = 120.0  # an upper bound for each wait below, not an expectation


def test_drain_timeout_aborts_what_is_left_and_frees_it() -> None:
    # The request is held at the step gate from its second decode step on, so it cannot
    # finish; the gate opens once the test has seen the 503s and the drain timeout has
    # aborted the request, whichever comes last. The checks have the drain timeout plus the
    # engine's own 5 s grace after its aborts before the server may stop without them.
    srv = ServerThread(reference_served(), drain_timeout=5.0)
    executor = srv.executor
    async_engine = app_state(srv.app).engine
    checked, aborted = threading.Event(), threading.Event()
    abort = async_engine.abort

    def open_gate_when_both() -> None:
        if checked.is_set() and aborted.is_set():
            executor.release()

    def drain_abort(request_id: str) -> None:  # the only abort here: the drain timeout's
        abort(request_id)
        aborted.set()
        open_gate_when_both()

    try:
        executor.hold(steps=2)  # the prefill step and one decode step, then the gate
        body = {"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True, "stream": True}
        with (
            httpx.Client(base_url=srv.url, headers=AUTH, timeout=DEADLINE_S) as c,
            c.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert executor.wait_held(DEADLINE_S), "the engine did not reach the step gate"
            async_engine.abort = drain_abort  # type: ignore[method-assign]
            srv.terminate()
            refused = httpx.post(
                f"{srv.url}/v1/completions",
                headers=AUTH,
                json={"prompt": [1], "max_tokens": 1},
                timeout=DEADLINE_S,
            )
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "service_unavailable"
            assert httpx.get(f"{srv.url}/health", timeout=DEADLINE_S).status_code == 503
            assert srv.thread.is_alive(), "the server exited with a request in flight"
            checked.set()
            open_gate_when_both()
            rest = [line for line in lines if line.startswith("data: ")]
        assert aborted.is_set(), "the drain timeout aborted nothing"
        assert rest[-1] == "data: [DONE]" and '"finish_reason":"abort"' in rest[-2]
        srv.thread.join(DEADLINE_S)
        assert not srv.thread.is_alive(), "the server did not exit after draining"
        engine = srv.served.engine
        assert engine.manager.pool.num_free == engine.manager.pool.num_usable
        assert not engine.has_unfinished()
        assert_consistent(engine.manager)
    finally:
        executor.release()
        srv.stop()
