"""Loopback stub servers for the bench tests: an OpenAI streaming server that is also a
P/D router (`/cluster`) and a decode engine (`/metrics`, via prometheus_client).

The engine simulates a prefix cache over 16-token blocks so hit counts are hand-computable:
a request's reusable length is `floor((len - 1) / 16) * 16` (one token is always computed);
`local` = the longest cached block prefix within that, `external` = the rest of it (as if
loaded from P), `kv_bytes_received` = external * BYTES_PER_TOKEN. With `publish=True` the
prompt's full blocks enter the cache when the request arrives (before any await, so
arrival order decides); with `publish=False` nothing is ever cached (the bug of
the upstream report, vLLM PR #56449).
`behaviour(n, body)` picks per request: ok, http_error, bad_chunk, error_event, drop
(connection closed mid-stream), stall, no_done (usage but no `[DONE]`).

Run as a script it is a stub `relaykv up`: `stub_cluster.py --json [--pd-policy P]`
prints one JSON line and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest

BLOCK = 16
BYTES_PER_TOKEN = 100
MODEL = "stub-model"


@dataclass
class EngineState:
    publish: bool = True
    vocab_size: int | None = 1000
    owned_by: str = "relaykv"
    ttft_per_external_token_s: float = 0.0
    token_delay_s: float = 0.0
    behaviour: Callable[[int, dict], str] = lambda n, body: "ok"
    blocks: set[tuple[int, ...]] = field(default_factory=set)
    received: list[dict] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    steps: list[dict] = field(default_factory=list)  # `GET /steps`: one per token written

    def __post_init__(self) -> None:
        def counter(name: str) -> Counter:
            return Counter(name, name, ["model_name"], registry=self.registry)

        self.local = counter("vllm:prefix_cache_hits")
        self.queries = counter("vllm:prefix_cache_queries")
        self.external = counter("vllm:external_prefix_cache_hits")
        self.bytes_received = counter("relaykv:kv_bytes_received")

    def admit(self, ids: list[int]) -> tuple[int, int]:
        """(local, external) hit tokens for a prompt; updates counters and the cache."""
        reusable = (len(ids) - 1) // BLOCK * BLOCK
        local = 0
        while local < reusable and tuple(ids[: local + BLOCK]) in self.blocks:
            local += BLOCK
        external = reusable - local
        self.local.labels(MODEL).inc(local)
        self.queries.labels(MODEL).inc(len(ids))
        self.external.labels(MODEL).inc(external)
        self.bytes_received.labels(MODEL).inc(external * BYTES_PER_TOKEN)
        if self.publish:
            for end in range(BLOCK, len(ids) + 1, BLOCK):
                self.blocks.add(tuple(ids[:end]))
        return local, external


def _prompt_ids(body: dict) -> list[int]:
    if "messages" in body:
        return [len(w) for w in body["messages"][0]["content"].split()]
    prompt = body["prompt"]
    return [len(w) for w in prompt.split()] if isinstance(prompt, str) else list(prompt)


def make_app(state: EngineState, cluster: Callable[[], dict]) -> web.Application:
    counter = {"n": 0}

    async def models(_: web.Request) -> web.Response:
        entry = {"id": MODEL, "object": "model", "owned_by": state.owned_by}
        if state.vocab_size:
            entry["vocab_size"] = state.vocab_size
        return web.json_response({"object": "list", "data": [entry]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(state.registry), content_type="text/plain")

    async def steps(request: web.Request) -> web.Response:
        since = float(request.query.get("since", "-inf"))
        kept = [s for s in state.steps if s["end"] >= since]
        return web.json_response({"now": time.perf_counter(), "steps": kept})

    async def cluster_info(_: web.Request) -> web.Response:
        return web.json_response(cluster())

    async def generate(request: web.Request) -> web.StreamResponse:
        # in flight = from arrival until just before [DONE] (a client waits for [DONE]
        # before it may send its next request)
        state.inflight += 1
        state.max_inflight = max(state.max_inflight, state.inflight)
        done = False

        def finished() -> None:
            nonlocal done
            if not done:
                done = True
                state.inflight -= 1

        try:
            return await _generate(request, finished)
        finally:
            finished()

    async def _generate(request: web.Request, finished: Callable[[], None]) -> web.StreamResponse:
        body = await request.json()
        n = counter["n"]
        counter["n"] += 1
        state.received.append(body)
        state.auth.append(request.headers.get("Authorization"))
        mode = state.behaviour(n, body)
        if mode == "http_error":
            return web.json_response(
                {"error": {"message": "stub failure", "code": 500}}, status=500
            )
        ids = _prompt_ids(body)
        local, external = state.admit(ids)
        chat = "messages" in body
        max_tokens = body.get("max_completion_tokens" if chat else "max_tokens", 16)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(state.ttft_per_external_token_s * external)
        if chat:  # vLLM's opening chunk: role only, no token
            opening = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            await response.write(f"data: {json.dumps({'choices': [opening]})}\n\n".encode())
        for i in range(max_tokens):
            if mode == "stall" and i == 1:
                await asyncio.sleep(30)
            if mode == "drop" and i == max_tokens // 2:
                request.transport.close()  # cut mid-stream: chunked body never ends
                return response
            if mode == "bad_chunk" and i == 1:
                await response.write(b"data: {not json\n\n")
            if mode == "error_event" and i == 1:
                await response.write(b'data: {"error": {"message": "engine died"}}\n\n')
            choice = (
                {"index": 0, "delta": {"content": f"t{i} "}}
                if chat
                else {"index": 0, "text": f"t{i} "}
            )
            start = time.perf_counter()
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            kind = "decode" if i else "prefill"
            work = {"request_id": f"stub-{n}", "kind": kind, "tokens": 1, "draft_tokens": 0}
            state.steps.append({"start": start, "end": time.perf_counter(), "work": [work]})
            await asyncio.sleep(state.token_delay_s)
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": max_tokens,
            "total_tokens": len(ids) + max_tokens,
            "prompt_tokens_details": {"cached_tokens": local},
        }
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        finished()
        if mode != "no_done":
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/steps", steps)
    app.router.add_get("/cluster", cluster_info)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


class ServerThread:
    """One stub server on 127.0.0.1, on its own event loop in a daemon thread."""

    def __init__(
        self, state: EngineState | None = None, cluster: Callable[[], dict] | None = None
    ) -> None:
        self.state = state or EngineState()
        self._cluster = cluster or (
            lambda: {"router": self.url, "prefill": [], "decode": [self.url]}
        )
        self.loop = asyncio.new_event_loop()
        self.url = ""
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("stub server did not start")

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(
            make_app(self.state, lambda: self._cluster()),
            handle_signals=False,
            shutdown_timeout=0.2,
        )
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        async def shutdown() -> None:
            await self.runner.cleanup()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    """A stub `relaykv up --json <flags>`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pd-policy", default="per-group", choices=["legacy", "per-group"])
    parser.add_argument("--fail-start", action="store_true")
    parser.add_argument("--ttft-per-token", type=float, default=2e-5)
    args = parser.parse_args()
    if args.fail_start:
        print("stub up: refusing to start", file=sys.stderr)
        return 3
    state = EngineState(
        publish=args.pd_policy == "per-group", ttft_per_external_token_s=args.ttft_per_token
    )
    server = ServerThread(state)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print("stub up: starting engines (a log line before the JSON)", flush=True)
    print(json.dumps({"router": server.url, "prefill": [], "decode": [server.url]}), flush=True)
    stop.wait()
    server.stop()
    print("stub up: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
