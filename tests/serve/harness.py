"""Test servers: the real app over the paging-sensitive reference executor, on loopback.

`reference_served` builds a `ServedEngine` through the real factory (`assemble_engine`)
around `PacedExecutor`: the reference executor (tests/engine) plus optional per-step delay
(to keep requests in flight for disconnect tests), a step gate the test holds and opens
(drain tests: a request stays in flight however slow the machine is) and deterministic
logprobs.
`ServerThread` runs the CLI's uvicorn server (`DrainingServer`) in a daemon thread on a free
port of 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Sequence

import uvicorn

from relaykv.common.messages.steps import StepBatch, StepOutput, TokenLogprobs
from relaykv.kvcache import Geometry, GroupSpec
from relaykv.serve import EngineOptions, ModelInfo, ServedEngine, assemble_engine
from relaykv.serve.api.app import app_state, create_app
from relaykv.serve.api.server import DrainingServer
from relaykv.serve.assembly.engine_factory import ConnectorFactory
from tests.engine.reference_executor import VOCAB, ReferenceExecutor, with_slot_bytes

HYBRID = Geometry((GroupSpec("full", 4), GroupSpec("sliding", 4, window=10)))
API_KEY = "test-key"


class CharTokenizer:
    """ids 1..95 are printable ASCII (32..126); every other id decodes to nothing."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 31 if 32 <= ord(c) <= 126 else ord("?") - 31 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i + 31) for i in ids if 1 <= i <= 95)


def fake_logprob(token: int) -> float:
    return -0.1 - (token % 7) / 10


class PacedExecutor(ReferenceExecutor):
    """The reference executor, `delay` seconds per step, logprobs from `fake_logprob`.

    The gate: after `hold(n)` the engine runs `n` more steps, then its next step waits
    (`wait_held` returns once it does) until `release()`."""

    GATE_TIMEOUT_S = 300.0  # a test that never releases fails instead of hanging

    def __init__(self, geometry: Geometry, num_blocks: int, k: int = 0) -> None:
        super().__init__(geometry, num_blocks, k=k)
        self.delay = 0.0
        self._gate = threading.Condition()
        self._steps_left: int | None = None  # None: the gate is open
        self._held = False

    def hold(self, steps: int = 0) -> None:
        with self._gate:
            self._steps_left = steps

    def release(self) -> None:
        with self._gate:
            self._steps_left = None
            self._gate.notify_all()

    def wait_held(self, timeout: float) -> bool:
        """Whether the engine's step is waiting at the closed gate within `timeout` s."""
        with self._gate:
            return self._gate.wait_for(lambda: self._held, timeout)

    def _pass_gate(self) -> None:
        with self._gate:
            if self._steps_left == 0:
                self._held = True
                self._gate.notify_all()
                opened = self._gate.wait_for(lambda: self._steps_left != 0, self.GATE_TIMEOUT_S)
                self._held = False
                if not opened:
                    raise RuntimeError("the test never opened the step gate")
            if self._steps_left is not None:
                self._steps_left -= 1

    def execute(self, batch: StepBatch) -> StepOutput:
        self._pass_gate()
        if self.delay:
            time.sleep(self.delay)
        out = super().execute(batch)
        for work, seq in zip(batch.sequences, out.sequences, strict=True):
            k = work.sampling.logprobs
            if work.sample and k:
                seq.logprobs = [
                    TokenLogprobs(
                        t,
                        fake_logprob(t),
                        tuple(((t + j) % VOCAB, fake_logprob(t) - j) for j in range(k)),
                    )
                    for t in seq.token_ids
                ]
        return out


def reference_served(
    tokenizer: bool = True,
    num_blocks: int = 400,
    max_model_len: int = 512,
    k: int = 0,
    connector_factory: ConnectorFactory | None = None,
    **options: object,
) -> ServedEngine:
    geometry = with_slot_bytes(HYBRID)
    model = ModelInfo(
        name="reference",
        source="tests/engine/reference_executor.py",
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        tokenizer=CharTokenizer() if tokenizer else None,
    )
    opts = EngineOptions(
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        max_num_batched_tokens=64,
        max_num_seqs=16,
        **options,  # type: ignore[arg-type]
    )
    return assemble_engine(
        opts,
        model,
        geometry,
        lambda n: PacedExecutor(geometry, n, k=k),
        connector_factory=connector_factory,
    )


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class ServerThread:
    """`relaykv serve`'s server for `create_app(served)` in a daemon thread."""

    def __init__(
        self, served: ServedEngine, api_key: str | None = API_KEY, drain_timeout: float = 2.0
    ) -> None:
        self.served = served
        self.app = create_app(served, api_key=api_key, drain_timeout=drain_timeout, idle_wait=0.01)
        self.sock = free_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on")
        # The CLI's server; off the main thread it installs no signal handlers, so tests
        # deliver "signals" by calling `handle_exit` (see `terminate`).
        self.server = DrainingServer(config, app_state(self.app))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    @property
    def executor(self) -> PacedExecutor:
        executor = self.served.engine.executor
        assert isinstance(executor, PacedExecutor)
        return executor

    def idle(self, timeout: float = 5.0) -> bool:
        """Wait until the engine holds no request and every block is free again."""
        engine = self.served.engine
        pool = engine.manager.pool
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not engine.has_unfinished() and pool.num_free == pool.num_usable:
                return True
            time.sleep(0.01)
        return False

    def terminate(self) -> None:
        """What SIGTERM does to `relaykv serve`: drain, then exit."""
        self.server.handle_exit(signal.SIGTERM, None)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
