"""A simulated P/D cluster driven by a simulated `bench serve` client.

The client sends each request at its arrival offset with at most `max_concurrency` in
flight (warmups first, unmeasured), like `relaykv bench serve`. The router is
`relaykv router`'s own policy code (`relaykv.sim.routing`), called directly: a request
goes to a prefill engine with `do_remote_decode` and `max_tokens=1`, P's answer (its
`kv_transfer_params`) goes with the original request to a decode engine, and D's tokens
are the client's stream (TTFT is D's first token). Each HTTP hop costs the hardware's
`request_overhead_s` of the router's time, and the router is one process: hops that meet
there are served one after another (a FIFO server), so requests a client sends at once
reach the engines staggered, as they do in a real cluster (a prefill engine starts on the
first before the others arrive). With no prefill engines the decode engines are
colocated ones and the router only balances them.

Under `disaggregation="conditional"` (relaykv router's `--disaggregation`) the router first
chooses the decode engine and applies the router's own `ConditionalRule`
(`SimRouter.path`): a sibling whose suffix there is short goes straight to it, which
prefills it (a local request); the others go P -> D as above (the decode engine is chosen
again when P answers). The rule's max suffix defaults to the cost estimate from the presets
(`cost_model.estimated_max_suffix`: the P trip's fixed cost, two router hops, two engine
steps and the link's latency, against the decode engine's prefill time) and the engines'
sibling reach to `policy.default_sibling_reach` of it, as `relaykv up` sets it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from relaykv.common.workloads import SampleRequest
from relaykv.engine import EngineConfig, InvalidRequest, Request, SamplingParams, SchedulerConfig
from relaykv.kvcache import PDPolicy, Role
from relaykv.router.policy import (
    DEFAULT_CONDITIONAL_MAX_RUNNING,
    ConditionalRule,
    default_sibling_reach,
)
from relaykv.sim.clock import EventLoop
from relaykv.sim.cost_model import estimated_max_suffix
from relaykv.sim.engine import SimEngine
from relaykv.sim.executor import CostModelExecutor
from relaykv.sim.hardware import HardwareSpec, LinkSpec
from relaykv.sim.models import ModelSpec
from relaykv.sim.routing import SimRouter
from relaykv.sim.shared_host import SharedHost
from relaykv.sim.tier import DEFAULT_TIER_BANDWIDTH, SimTier
from relaykv.sim.transport import SimTransport


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    model: ModelSpec
    hardware: HardwareSpec
    link: LinkSpec
    pd_policy: str = "per-group"
    num_prefill: int = 1
    num_decode: int = 1
    prefill_tp: int = 1
    decode_tp: int = 1
    num_speculative_tokens: int = 0
    acceptance_rate: float = 0.7
    num_blocks: int = 10000
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    retention: str = "auto"  # as `relaykv serve`: dense on prefill engines (docs/design.md §6)
    prefill_prefix_caching: bool = True  # False: the upstream report's baseline image
    routing: str = "cache-aware"  # relaykv router's --routing
    # A KV tier per engine (docs/tier.md; simulator.md "KV tier"): bytes (None: no tier),
    # its host link's bytes/s, and the checkpoint interval (None: the engine's default).
    kv_offloading_size: int | None = None
    kv_offloading_bandwidth: float = DEFAULT_TIER_BANDWIDTH
    kv_offloading_interval: int | None = None
    disaggregation: str = "always"  # relaykv router's --disaggregation (module docstring)
    conditional_max_suffix: int | None = None  # None: the cost estimate from the presets
    conditional_max_queued_prefill: int | None = None  # None: the max suffix
    conditional_max_running: int = DEFAULT_CONDITIONAL_MAX_RUNNING

    def trip_seconds(self) -> float:
        """The P trip's fixed cost: P's answer back through the router and the hop on to D,
        P's step and D's load step (overheads), the link's per-transfer latency."""
        hw = self.hardware
        return 2 * hw.request_overhead_s + 2 * hw.step_overhead_s + self.link.latency_s

    def conditional_rule(self) -> ConditionalRule:
        max_suffix = self.conditional_max_suffix
        if max_suffix is None:
            max_suffix = estimated_max_suffix(
                self.model, self.hardware, self.decode_tp, self.trip_seconds(),
                self.scheduler.max_model_len,
            )
        return ConditionalRule(
            self.disaggregation,
            max_suffix,
            self.conditional_max_queued_prefill,
            self.conditional_max_running,
        )


@dataclass(slots=True)
class RequestRecord:
    """What the client saw of one request (the `bench serve` per-request fields)."""

    index: int
    prompt_len: int
    output_len: int
    send_time: float = 0.0
    first_token_time: float | None = None
    end_time: float | None = None
    output_tokens: int = 0
    error: str | None = None
    warmup: bool = False
    decode_engine: str = ""
    path: str = "pd"  # "local": its decode engine prefilled it (conditional disaggregation)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_time is not None


class SimCluster:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.loop = EventLoop()
        self.transport = SimTransport(self.loop, spec.link, self._notify)
        # A CPU calibration describes one machine running every engine: their steps share its
        # cores (`relaykv.sim.shared_host`). Accelerator presets (slowdown 1) do not.
        slowdown = spec.hardware.shared_host_slowdown
        self.host = SharedHost(self.loop, slowdown) if slowdown > 1.0 else None
        self.engines: dict[str, SimEngine] = {}
        colocated = spec.num_prefill == 0
        self.rule = spec.conditional_rule()
        self.conditional = not colocated and spec.disaggregation != "always"
        # The engines' sibling reach, as `relaykv up` sets it (0 when every request is P -> D)
        self.sibling_reach = default_sibling_reach(self.rule.max_suffix) if self.conditional else 0
        for i in range(spec.num_prefill):
            self._add_engine(f"prefill{i}", "prefill", spec.prefill_tp)
        for i in range(spec.num_decode):
            self._add_engine(f"decode{i}", "colocated" if colocated else "decode", spec.decode_tp)
        by_role: dict[str, list[SimEngine]] = {}
        for engine in self.engines.values():
            by_role.setdefault("prefill" if engine.role == "prefill" else "decode", []).append(
                engine
            )
        self.router = SimRouter(spec.routing, by_role, self.rule)
        self.first_role = "decode" if colocated else "prefill"
        self._router_free_at = 0.0
        self.records: list[RequestRecord] = []
        self._live: dict[str, tuple[RequestRecord, SamplingParams, list[int]]] = {}
        self._on_done: Callable[[RequestRecord], None] = lambda r: None
        self._progress_hook: Callable[[RequestRecord], None] = lambda r: None

    def _add_engine(self, name: str, role: str, tp: int) -> None:
        s = self.spec
        executor = CostModelExecutor(
            s.model,
            s.hardware,
            tp=tp,
            num_speculative_tokens=s.num_speculative_tokens,
            acceptance_rate=s.acceptance_rate,
        )
        scheduler = s.scheduler
        if role == "decode" and self.conditional:  # local prefill in chunks of the max suffix
            scheduler = replace(scheduler, max_local_prefill_tokens=max(16, self.rule.max_suffix))
        config = EngineConfig(
            enable_prefix_caching=s.prefill_prefix_caching or role != "prefill",
            num_blocks=s.num_blocks,
            scheduler=scheduler,
            sibling_reach=self.sibling_reach,
            retention=s.retention,
            role=Role.parse(role),
            pd_policy=PDPolicy.parse(s.pd_policy),
            model_name=s.model.name,
            kv_offloading_interval=s.kv_offloading_interval,
        )
        tier = None
        if s.kv_offloading_size is not None:
            block_bytes = executor.geometry.block_bytes
            tier = SimTier(
                self.loop,
                s.kv_offloading_size // block_bytes,
                block_bytes,
                s.kv_offloading_bandwidth,
                on_done=lambda: self.engines[name].kick(),
            )
        self.engines[name] = SimEngine(
            name,
            executor,
            config,
            self.loop,
            self._progress,
            self.transport,
            tier=tier,
            host=self.host,
        )

    def _notify(self, engine_id: str) -> None:
        self.engines[engine_id].kick()

    # -- the router --------------------------------------------------------------------
    def submit(self, record: RequestRecord, prompt: list[int], params: SamplingParams) -> None:
        """The client sends a request now; `on_done` is called once it ends."""
        rid = f"req-{record.index}" + ("-w" if record.warmup else "")
        record.send_time = self.loop.now
        self.records.append(record)
        self._live[rid] = (record, params, prompt)
        kv = {"do_remote_decode": True} if self.first_role == "prefill" else None
        if self.conditional:
            self._hop(lambda: self._route(rid, prompt, params, kv))
            return
        self._hop(lambda: self._to_engine(self.first_role, rid, prompt, params, kv))

    def _route(
        self, rid: str, prompt: list[int], params: SamplingParams, kv: dict[str, Any] | None
    ) -> None:
        """Conditional disaggregation: the decode engine's choice and the path rule."""
        engine = self.router.pick("decode", prompt)
        path = self.router.path(engine, prompt)
        if not path.local:
            self.router.done(engine)
            self._to_engine("prefill", rid, prompt, params, kv)
            return
        try:
            engine.add(rid, prompt, params, None)
        except InvalidRequest as exc:
            self.router.done(engine)
            self._fail(rid, f"{exc}")
            return
        record = self._live[rid][0]
        record.decode_engine, record.path = engine.name, "local"
        self.router.queue(engine, rid, max(0, path.suffix))
        self.router.stream(engine, rid, params.max_tokens)

    def _hop(self, fn: Callable[[], None]) -> None:
        """Run `fn` once the router has spent a hop on it (after the hops before it)."""
        start = max(self.loop.now, self._router_free_at)
        self._router_free_at = start + self.spec.hardware.request_overhead_s
        self.loop.at(self._router_free_at, fn)

    def _to_engine(
        self,
        role: str,
        rid: str,
        prompt: list[int],
        params: SamplingParams,
        kv: dict[str, Any] | None,
    ) -> None:
        engine = self.router.pick(role, prompt)
        try:
            engine.add(rid, prompt, params, kv)
        except InvalidRequest as exc:
            self.router.done(engine)
            self._fail(rid, f"{exc}")
            return
        if role == "decode":
            self._live[rid][0].decode_engine = engine.name
            self.router.stream(engine, rid, params.max_tokens)

    def _progress(self, engine: SimEngine, req: Request, new_tokens: list[int]) -> None:
        rid = req.request_id
        entry = self._live.get(rid)
        if entry is None:
            return
        record, params, prompt = entry
        now = self.loop.now
        if engine.role == "prefill":
            if not req.finished:
                return
            self.router.done(engine)
            if req.error or req.kv_transfer_params is None:
                self._fail(rid, req.error or "the prefill engine returned no transfer params")
                return
            kv = dict(req.kv_transfer_params)
            self._hop(lambda: self._to_engine("decode", rid, prompt, params, kv))
            return
        if new_tokens:
            if record.first_token_time is None:
                record.first_token_time = now
                self.router.unqueue(rid)
            record.output_tokens += len(new_tokens)
        if req.finished:
            self.router.unqueue(rid)
            self.router.unstream(rid)
            self.router.done(engine)
            if req.error:
                self._fail(rid, req.error)
                return
            record.end_time = now
            del self._live[rid]
            self._on_done(record)

    def _fail(self, rid: str, error: str) -> None:
        record = self._live.pop(rid)[0]
        record.error = error
        record.end_time = self.loop.now
        self._on_done(record)

    # -- the client --------------------------------------------------------------------
    def run(
        self,
        requests: list[SampleRequest],
        offsets: list[float],
        *,
        max_concurrency: int | None,
        num_warmups: int,
        ignore_eos: bool = True,
        on_measured: Callable[[], None] = lambda: None,
        on_request_done: Callable[[RequestRecord], None] = lambda r: None,
    ) -> float:
        """Warm up, then send every request; returns the measured phase's start time.
        `on_measured` runs between the two (a counter scrape); `on_request_done` after each
        request (a progress bar)."""
        self._progress_hook = on_request_done

        def params(r: SampleRequest) -> SamplingParams:
            return SamplingParams(max_tokens=r.output_len, temperature=0.0, ignore_eos=ignore_eos)

        limit = max_concurrency or 1 << 30
        if num_warmups:
            first = requests[0]
            self._send_gated([(first, 0.0)] * num_warmups, limit, params, warmup=True)
            self.loop.run()
        on_measured()
        start = self.loop.now
        self._send_gated(list(zip(requests, offsets, strict=True)), limit, params, warmup=False)
        self.loop.run()
        return start

    def _send_gated(
        self,
        items: list[tuple[SampleRequest, float]],
        limit: int,
        params: Callable[[SampleRequest], SamplingParams],
        warmup: bool,
    ) -> None:
        start = self.loop.now
        queue: deque[tuple[int, SampleRequest]] = deque()
        state = {"in_flight": 0}
        base = len(self.records)

        def pump() -> None:
            while queue and state["in_flight"] < limit:
                i, r = queue.popleft()
                state["in_flight"] += 1
                self.submit(
                    RequestRecord(base + i, r.prompt_len, r.output_len, warmup=warmup),
                    r.prompt_ids,
                    params(r),
                )

        def done(record: RequestRecord) -> None:
            state["in_flight"] -= 1
            self._progress_hook(record)
            pump()

        self._on_done = done
        for i, (r, offset) in enumerate(items):

            def arrive(i: int = i, r: SampleRequest = r) -> None:
                queue.append((i, r))
                pump()

            self.loop.at(start + offset, arrive)

    def counters(self) -> dict[str, dict[str, int]]:
        """Cache stats summed per role (the engines' `/metrics` counters)."""
        out: dict[str, dict[str, int]] = {}
        for engine in self.engines.values():
            role = "prefill" if engine.role == "prefill" else "decode"
            totals = out.setdefault(role, {})
            for key, value in engine.manager.stats.snapshot().items():
                if isinstance(value, int):
                    totals[key] = totals.get(key, 0) + value
            m = engine.engine.metrics
            for key, value in (
                ("preemptions", engine.scheduler.num_preemptions),
                ("draft_tokens", m.spec_num_draft_tokens),
                ("accepted_tokens", m.spec_num_accepted_tokens),
                ("steps", engine.num_steps),
            ):
                totals[key] = totals.get(key, 0) + value
        return out

    def check(self) -> list[str]:
        problems = [f"{name}: {p}" for name, e in self.engines.items() for p in e.check()]
        if self.host is not None:
            problems += [f"shared host: {p}" for p in self.host.check()]
        return problems
