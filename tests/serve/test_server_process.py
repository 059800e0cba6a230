"""`relaykv serve` as a subprocess on tiny-hybrid: exact greedy output, cache hits, SIGTERM.

Deadlines are generous (a loaded machine runs tiny-hybrid several times slower) and every
wait ends on a condition: a line printed, a status seen, the process gone."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from relaykv.engine import SamplingParams
from relaykv.serve import EngineOptions, build_engine
from relaykv.transfer.transport.registry import transport_class
from relaykv.transfer.transport.wire.auth import write_secret_file

ROOT = Path(__file__).resolve().parents[2]
KEY = "process-key"
FLAGS = ["--max-model-len", "1024", "--kv-cache-memory", "64MiB", "--seed", "0"]
# Upper bounds, not expectations: a drain ends when its requests end (400 tokens took 10 s
# at load 4.7; a 30 s drain timeout aborted them at load 13), startup takes seconds.
DRAIN_TIMEOUT = "600"
START_S = 300.0


class ServeProcess:
    def __init__(self, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RELAYKV_API_KEY": KEY}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relaykv", "serve", "--port", "0", *FLAGS, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""
        deadline = time.monotonic() + START_S
        while not self.url:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise RuntimeError(
                    "relaykv serve did not start:\n" + "".join(self.output)
                ) from None
            if "listening on " in line:
                self.url = line.split("listening on ")[1].split()[0]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def tiny() -> Iterator[ServeProcess]:
    srv = ServeProcess("--drain-timeout", DRAIN_TIMEOUT)
    yield srv
    srv.kill()


PROMPTS = [[1, *range(40, 40 + n)] for n in (5, 33, 70, 17)]
MAX_TOKENS = [12, 20, 6, 16]


def test_startup_prints_sizing(tiny: ServeProcess) -> None:
    text = "".join(tiny.output)
    for needle in (
        "KV geometry: g0=full(b=16), g1=sliding(b=16, W=64)",
        "KV pool: 1365 blocks",
        "per-request caps",
        "max concurrency",
        "shortest reusable prompt 17 tokens",
    ):
        assert needle in text, needle


def test_startup_prints_and_models_report_the_tokenizer_directory(tiny: ServeProcess) -> None:
    """The exported HF tokenizer: printed at startup, reported by /v1/models and /v1/models/{id},
    and loadable offline by transformers (what vllm bench serve --tokenizer needs)."""
    card = tiny.client().models.retrieve("tiny-hybrid")
    path = card.model_extra["tokenizer"]
    assert f"tokenizer: {path} (a Hugging Face directory" in "".join(tiny.output)
    assert tiny.client().models.list().data[0].model_extra["tokenizer"] == path
    assert (Path(path) / "tokenizer.json").is_file()
    assert (Path(path) / "tokenizer_config.json").is_file()


def test_greedy_output_equals_the_engine_run_directly(tiny: ServeProcess) -> None:
    client = tiny.client()

    async def one(prompt: list[int], n: int) -> list[int]:
        aclient = openai.AsyncOpenAI(base_url=f"{tiny.url}/v1", api_key=KEY, max_retries=0)
        tokens: list[int] = []
        async for chunk in await aclient.completions.create(
            model="tiny-hybrid",
            prompt=prompt,
            max_tokens=n,
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        ):
            tokens += chunk.choices[0].model_extra["token_ids"]
        await aclient.close()
        return tokens

    async def all_at_once() -> list[list[int]]:
        return await asyncio.gather(*(one(p, n) for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)))

    served = asyncio.run(all_at_once())
    direct = build_engine(
        EngineOptions(max_model_len=1024, kv_cache_memory=64 << 20, seed=0), progress=False
    ).engine
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    reqs = direct.generate(PROMPTS, params)
    assert served == [r.output_ids for r in reqs]
    # and a text prompt decodes to the engine's own detokenization
    resp = client.completions.create(
        model="tiny-hybrid",
        prompt="Hello",
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.usage.prompt_tokens == 6  # BOS + 5 bytes


def test_shared_prefix_is_cached_with_the_real_model(tiny: ServeProcess) -> None:
    client = tiny.client()
    x = [1, *range(100, 180)]  # 81 tokens
    first = client.completions.create(model="tiny-hybrid", prompt=[*x, 7], max_tokens=2)
    again = client.completions.create(model="tiny-hybrid", prompt=[*x, 7], max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 80  # aligned to 16


def test_extreme_but_valid_sampling_values_do_not_hurt_the_engine(tiny: ServeProcess) -> None:
    """Values the API accepts reach the real runner; none may take the engine thread down."""
    client = tiny.client()
    extremes = [
        {"top_k": 259, "temperature": 1e6},  # top_k = the vocabulary: the largest accepted
        {"seed": -5, "temperature": 0.5},
        {"seed": 2**64 - 1, "temperature": 0.5, "top_p": 1e-9},
        {"seed": -(2**63), "temperature": 1e-300},  # below 1e-5: greedy, as vLLM
        {"temperature": 0, "logprobs": 20},
        {"temperature": 2.0, "top_k": 1, "min_tokens": 3},
    ]
    for extra in extremes:
        resp = client.completions.create(
            model="tiny-hybrid",
            prompt=[1, 50, 60],
            max_tokens=3,
            extra_body={"ignore_eos": True, **extra},
        )
        assert resp.usage.completion_tokens == 3, extra
    refused = [({"top_k": 10**9}, "top_k"), ({"seed": 2**64}, "seed"), ({"seed": 2**70}, "seed")]
    for extra, field in refused:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny-hybrid", prompt=[1, 5], extra_body=extra)
        assert err.value.body["param"] == field
    same = [
        client.completions.create(
            model="tiny-hybrid",
            prompt=[1, 9],
            max_tokens=6,
            temperature=1.0,
            seed=7,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert same[0] == same[1]  # a seeded request is reproducible
    assert httpx.get(f"{tiny.url}/health").status_code == 200


def _sigterm_drains_then_exits_0(srv: ServeProcess) -> None:
    """SIGTERM while a streamed request is in flight: new requests and /health get 503 at
    once, the in-flight request runs to its end (not aborted), then the process exits 0."""
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {
        "prompt": [1, 5, 6, 7],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    statuses: list[int] = []
    with (
        httpx.Client(base_url=srv.url, headers=headers, timeout=120) as c,
        c.stream("POST", "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        srv.proc.send_signal(signal.SIGTERM)
        with httpx.Client(base_url=srv.url, headers=headers, timeout=120) as other:
            # until the signal is handled; the in-flight request keeps the server up
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                status = other.post("/v1/completions", json={"prompt": [1], "max_tokens": 1})
                statuses.append(status.status_code)
                if status.status_code == 503:
                    assert status.json()["error"]["code"] == "service_unavailable"
                    assert other.get("/health").status_code == 503
                    break
                time.sleep(0.02)
        rest = [line for line in lines if line.startswith("data: ")]
    assert statuses[-1] == 503, statuses
    assert rest[-1] == "data: [DONE]"
    assert '"completion_tokens":400' in rest[-2]  # finished, not aborted
    assert srv.proc.wait(120) == 0, "".join(srv.output[-20:])


def test_sigterm_drains_in_flight_requests_then_exits_0(tiny: ServeProcess) -> None:
    _sigterm_drains_then_exits_0(tiny)


@pytest.mark.skipif(
    transport_class("nixl").availability() is not None,
    reason=f"nixl: {transport_class('nixl').availability()}",
)
def test_sigterm_on_a_nixl_engine_drains_then_exits_0(tmp_path: Path) -> None:
    """A prefill engine on the nixl transport: the drain ends with status 0. (UCX's libraries
    crash in the C runtime's exit-time destructors, status 139, unless `relaykv serve` ends
    without them: pd_wiring.finish_process.)"""
    secret = write_secret_file(tmp_path / "kv-secret")
    srv = ServeProcess(
        "--role",
        "prefill",
        "--kv-transport",
        "nixl",
        "--kv-secret-file",
        str(secret),
        "--drain-timeout",
        DRAIN_TIMEOUT,
    )
    try:
        _sigterm_drains_then_exits_0(srv)
    finally:
        srv.kill()
