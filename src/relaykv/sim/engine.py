"""One simulated engine: the real `LLMEngine`'s scheduler and cache, stepped on the clock.

`LLMEngine.step()` schedules, executes and commits at once; here a step is split at the
executor: `schedule()` and `execute()` run when the step starts, and `update()` (tokens,
hashes, window frees, P/D hand-over) runs when its modelled duration has passed, so KV
is hashed, handed to D and visible to siblings only once it would have been written.
Between the two, arrivals and transfer completions wait for the next step, as they do in
the real engine's step loop. An engine is `busy` during a step; `kick()` schedules a step
now if it is idle (a new request, a finished transfer, freed blocks on P). With a
`SharedHost` (a CPU calibration: every engine on one machine) a step's modelled duration is
its work alone, and it ends when the host has done that work (`relaykv.sim.shared_host`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relaykv.common.messages.steps import StepBatch, StepOutput
from relaykv.engine import EngineConfig, LLMEngine, Request, SamplingParams
from relaykv.engine.scheduler import ScheduledSequence
from relaykv.kvcache import CacheLifecycle
from relaykv.kvcache.tier import TierBackend
from relaykv.sim.clock import EventLoop
from relaykv.sim.executor import CostModelExecutor
from relaykv.sim.shared_host import SharedHost
from relaykv.transfer.connector import PDConnector

# (engine, request, new tokens): called for every request a step advanced or finished.
OnProgress = Callable[["SimEngine", Request, list[int]], None]


class SimEngine:
    def __init__(
        self,
        name: str,
        executor: CostModelExecutor,
        config: EngineConfig,
        loop: EventLoop,
        on_progress: OnProgress,
        transport: Any = None,
        tier: TierBackend | None = None,
        host: SharedHost | None = None,
    ) -> None:
        """`tier`: a KV tier (`relaykv.sim.tier.SimTier`) below the engine's pool; `host`:
        the CPUs this engine's steps share with the other engines' (None: its own devices)."""
        self.name = name
        self.role = config.role
        self.executor = executor
        self.loop = loop
        self.engine = LLMEngine(executor, config, tier=tier)
        self.scheduler = self.engine.scheduler
        self.manager: CacheLifecycle = self.engine.manager
        self.connector: PDConnector | None = None
        if config.role != "colocated":
            self.connector = PDConnector(
                config.role, self.engine.manager, transport, None, engine_id=name, lease_seconds=1e9
            )
            self.engine.attach_connector(self.connector)
        self.on_progress = on_progress
        self.host = host
        self.busy = False
        self._kicked = False
        self.num_steps = 0
        self.busy_seconds = 0.0

    def add(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> Request:
        """Validate and queue a request (raises `InvalidRequest` like the server's 400)."""
        req = self.engine.add_request(
            request_id, prompt, params, kv_transfer_params=kv_transfer_params
        )
        self.kick()
        return req

    def kick(self) -> None:
        if not self.busy and not self._kicked:
            self._kicked = True
            self.loop.after(0.0, self._start_step)

    def _start_step(self) -> None:
        self._kicked = False
        if self.busy:
            return
        scheduled = self.scheduler.schedule()
        self._report_finished_now()
        if not scheduled:
            return  # idle until kicked: an arrival, a transfer, freed blocks
        result = self.executor.execute(StepBatch([s.work for s in scheduled]))
        assert self.executor.last_cost is not None
        duration = self.executor.last_cost.seconds
        self.busy = True
        self.num_steps += 1
        self.busy_seconds += duration  # work alone: a shared host may take longer
        if self.host is None:
            self.loop.after(duration, lambda: self._end_step(scheduled, result))
        else:
            self.host.run(duration, lambda: self._end_step(scheduled, result))

    def _end_step(self, scheduled: list[ScheduledSequence], result: StepOutput) -> None:
        self.busy = False
        metrics = self.engine.metrics
        metrics.num_steps += 1
        for out in result.sequences:
            metrics.speculation(out.num_draft_tokens, out.num_accepted_tokens)
        for req, new_tokens in self.scheduler.update(scheduled, result.sequences):
            self._progress(req, new_tokens)
        self._report_finished_now()
        self.kick()

    def _report_finished_now(self) -> None:
        finished = list(self.scheduler.finished_now)
        self.scheduler.finished_now.clear()
        for req in finished:
            self._progress(req, [])

    def _progress(self, req: Request, new_tokens: list[int]) -> None:
        if req.finished:
            self.engine.requests.pop(req.request_id, None)
        self.on_progress(self, req, new_tokens)

    def check(self) -> list[str]:
        """The scheduler's, the cache's and the connector's invariant checkers."""
        problems = self.scheduler.check() + self.manager.check()
        if self.connector is not None:
            problems += self.connector.check()
        return problems
