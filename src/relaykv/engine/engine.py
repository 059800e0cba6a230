"""The synchronous engine: validate and add requests, step, produce outputs.

`LLMEngine.step()` polls P/D transfers, asks the scheduler for a batch, runs it on the
executor, commits the results, detokenizes, applies stop strings, and returns one
`RequestOutput` per request that changed. Servers drive it from `AsyncEngine`'s thread.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from relaykv.common.messages.steps import InvalidRequest, SamplingParams, StepBatch
from relaykv.engine.connector import KVConnector
from relaykv.engine.detokenizer import Tokenizer, detokenize_new, find_stop
from relaykv.engine.executor import Executor
from relaykv.engine.metrics import EngineMetrics
from relaykv.engine.request import FinishReason, Request, RequestOutput
from relaykv.engine.scheduler import ScheduledSequence, Scheduler, SchedulerConfig
from relaykv.engine.step_log import StepLog, StepWork, work_kind
from relaykv.kvcache import (
    DEFAULT_PD_POLICY,
    CacheSizing,
    KVCacheManager,
    PDPolicy,
    Role,
    parse_retention,
)
from relaykv.kvcache.geometry import EagleReuse
from relaykv.kvcache.tier import TierBackend


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_blocks: int
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    retention: str = "auto"  # dense on a prefill engine, boundaries elsewhere (§6)
    enable_prefix_caching: bool = True
    role: Role = Role.COLOCATED
    pd_policy: PDPolicy = DEFAULT_PD_POLICY
    sibling_reach: int = 0  # the P/D plan's sibling reach in tokens (kvcache/pd_plan.py)
    # With a draft: how a prefix hit treats the draft KV at its last position (§4).
    eagle_reuse: EagleReuse = "drop"
    model_name: str = "relaykv"
    # The startup sizing (built and checked once, by whoever sized the pool); None: the
    # cache manager builds it from the fields above.
    sizing: CacheSizing | None = None
    # Checkpoint interval of a KV tier (docs/tier.md); None: the retention interval or A.
    kv_offloading_interval: int | None = None


class LLMEngine:
    def __init__(
        self,
        executor: Executor,
        config: EngineConfig,
        *,
        tokenizer: Tokenizer | None = None,
        eos_token_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        connector: KVConnector | None = None,
        tier: TierBackend | None = None,
    ) -> None:
        """`tier`: a KV tier below the pool (docs/tier.md), built over this executor's KV
        pages (`executor.kv_buffer`)."""
        self.role = Role.parse(config.role)
        self.executor = executor
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        sched = config.scheduler
        k = executor.num_speculative_tokens
        self.manager = KVCacheManager(
            executor.geometry.with_eagle_reuse(config.eagle_reuse),
            config.num_blocks,
            retention=parse_retention(config.retention, executor.geometry.alignment, self.role),
            pd_policy=config.pd_policy,
            enable_caching=config.enable_prefix_caching,
            max_model_len=sched.max_model_len,
            max_in_flight_tokens=sched.max_num_batched_tokens + k,
            pd_role=self.role.in_pd_pair,
            sizing=config.sizing,
            sibling_reach=config.sibling_reach,
            tier=tier,
            tier_interval=config.kv_offloading_interval,
        )
        self.metrics = EngineMetrics(config.scheduler.max_model_len)
        self.steps = StepLog()  # the recent steps' times and batches (`GET /steps`)
        self.scheduler = Scheduler(
            sched, self.manager, k, connector, self.eos_token_ids, metrics=self.metrics
        )
        self.connector = connector
        self.requests: dict[str, Request] = {}

    def attach_connector(self, connector: KVConnector) -> None:
        """Plug a P/D connector in (it is built over this engine's cache manager)."""
        if not self.role.in_pd_pair:
            raise ValueError("a colocated engine has no KV connector")
        self.connector = connector
        self.scheduler.connector = connector

    # -- requests --------------------------------------------------------------------
    def refuses_locally(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> str | None:
        """Why a decode engine cannot take a request sent without KV (a local request:
        conditional disaggregation, docs/routing.md) now: its pool could not admit the
        request's worst case (prompt + max_tokens). The router then sends it through a
        prefill engine. None: take it (always, on other roles and for P/D requests)."""
        if self.role is not Role.DECODE or kv_transfer_params:
            return None
        n = min(len(prompt_ids) + params.max_tokens, self.config.scheduler.max_model_len)
        need = self.manager.sizing.admission_blocks(n)
        free = self.manager.pool.num_free
        if need <= free:
            return None
        return (
            f"the decode engine's KV pool cannot take a local request of {n} tokens now "
            f"({need} blocks needed, {free} free); send it through a prefill engine"
        )

    def validate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        kv_transfer_params: dict[str, Any] | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Raise `InvalidRequest` for anything the engine cannot serve (changes nothing)."""
        if kv_transfer_params is not None and not isinstance(kv_transfer_params, dict):
            raise InvalidRequest("kv_transfer_params", "kv_transfer_params must be an object")
        if not prompt_ids:
            raise InvalidRequest("prompt", "the prompt is empty")
        # Fast path for the common case (every id a plain int in range: C-level passes over
        # a 64k-token prompt instead of four Python checks per token); else find the culprit.
        plain = set(map(type, prompt_ids)) == {int}
        top = self.vocab_size
        if not (plain and min(prompt_ids) >= 0 and (top is None or max(prompt_ids) < top)):
            for token in prompt_ids:
                if (
                    not isinstance(token, int)
                    or isinstance(token, bool)
                    or token < 0
                    or (top is not None and token >= top)
                ):
                    raise InvalidRequest("prompt", f"invalid token id {token!r} in the prompt")
        params.validate(self.vocab_size)
        if params.stop and self.tokenizer is None:
            raise InvalidRequest("stop", "stop strings need a tokenizer; this model has none")
        limit = self.config.scheduler.max_model_len
        if len(prompt_ids) >= limit:
            raise InvalidRequest(
                "prompt",
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{len(prompt_ids)}",
            )
        # A prefill engine (do_remote_decode) checks the client's max_tokens as the decode
        # engine will, so what D would refuse is refused before any compute (docs/pd.md).
        remote_decode = bool(kv_transfer_params and kv_transfer_params.get("do_remote_decode"))
        if len(prompt_ids) + params.max_tokens > limit:
            raise InvalidRequest(
                "max_tokens",
                f"this model's maximum context length is {limit} tokens; {len(prompt_ids)} "
                f"prompt tokens + {params.max_tokens} max_tokens exceed it",
            )
        if self.manager.sizing.admission_blocks(len(prompt_ids)) > self.manager.pool.num_usable:
            raise InvalidRequest("prompt", "the prompt does not fit in the KV cache of this engine")
        if kv_transfer_params:
            remote = kv_transfer_params.get("do_remote_prefill") or remote_decode
            if remote and self.connector is None:
                raise InvalidRequest("kv_transfer_params", "this engine is not part of a P/D pair")
            if self.connector is not None:
                try:
                    self.connector.validate(kv_transfer_params, prompt_ids, cache_salt)
                except (ValueError, TypeError, KeyError) as exc:
                    raise InvalidRequest("kv_transfer_params", str(exc)) from exc

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        if request_id in self.requests:
            raise InvalidRequest("request_id", f"request id {request_id!r} is already running")
        self.validate(prompt_ids, params, kv_transfer_params, cache_salt)
        if kv_transfer_params and kv_transfer_params.get("do_remote_decode"):
            # A prefill engine produces exactly one token; the decode engine does the rest.
            params = dataclasses.replace(params, max_tokens=1, min_tokens=0)
        req = Request(request_id, list(prompt_ids), params, cache_salt, kv_transfer_params)
        if arrival_time is not None:
            req.arrival_time = arrival_time
        self.requests[request_id] = req
        self.scheduler.add(req)
        self.metrics.prompt_tokens += len(prompt_ids)
        return req

    def abort(self, request_id: str) -> bool:
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        self.scheduler.finished_now.append(req)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0 or bool(self.scheduler.finished_now)

    # -- stepping --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        outputs: list[RequestOutput] = []
        now = time.monotonic()
        if scheduled:
            start = time.perf_counter()
            result = self.executor.execute(StepBatch([s.work for s in scheduled]))
            self.steps.add(start, time.perf_counter(), [_step_work(s) for s in scheduled])
            self.metrics.num_steps += 1
            self.metrics.iteration_tokens.observe(
                sum(len(s.work.token_ids) + len(s.work.draft_token_ids) for s in scheduled)
            )
            for s in scheduled:
                if s.request.first_scheduled_time is None:
                    s.request.first_scheduled_time = now
            for out in result.sequences:
                self.metrics.speculation(out.num_draft_tokens, out.num_accepted_tokens)
            now = time.monotonic()
            for req, new_tokens in self.scheduler.update(scheduled, result.sequences):
                outputs.append(self._output(req, new_tokens, now))
        for req in self.scheduler.finished_now:
            outputs.append(self._output(req, [], now))
        self.scheduler.finished_now.clear()
        return [o for o in outputs if o.new_token_ids or o.finished or o.new_text]

    def _output(self, req: Request, new_tokens: list[int], now: float) -> RequestOutput:
        new_text = ""
        if new_tokens:
            self.metrics.generation_tokens += len(new_tokens)
            if req.first_token_time is None:
                req.first_token_time = now
                self.metrics.ttft.observe(now - req.arrival_time)
            elif req.last_token_time is not None:
                self.metrics.itl.observe(now - req.last_token_time)
            req.last_token_time = now
        if self.tokenizer is not None and (new_tokens or req.finished):
            new_text = self._text(req)
        if req.finished and req.request_id in self.requests:
            del self.requests[req.request_id]
            self.metrics.finished(req.finish_reason.value if req.finish_reason else "abort")
            computed = req.num_prompt_tokens - req.num_cached_tokens - req.num_external_tokens
            self.metrics.request_done(
                now,
                req.arrival_time,
                req.first_scheduled_time,
                req.first_token_time,
                req.num_prompt_tokens,
                len(req.output_ids),
                max(0, computed),
            )
        logprobs = None
        if req.params.logprobs and new_tokens:
            logprobs = req.logprobs[len(req.logprobs) - len(new_tokens) :]
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_tokens,
            new_text=new_text,
            new_logprobs=logprobs,
            finished=req.finished,
            finish_reason=req.finish_reason.value if req.finish_reason else None,
            stop_reason=req.stop_reason,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=len(req.output_ids),
            num_cached_tokens=req.num_cached_tokens,
            # Only a prefill engine answers with transfer parameters (where its KV is).
            kv_transfer_params=req.kv_transfer_params
            if req.finished and self.role is Role.PREFILL
            else None,
            error=req.error,
        )

    def _text(self, req: Request) -> str:
        """New text to stream. With stop strings, the last `len(stop) - 1` characters are
        held back until they can no longer begin a stop string (as vLLM does)."""
        assert self.tokenizer is not None
        skip = self.eos_token_ids | frozenset(req.params.stop_token_ids)
        new = detokenize_new(self.tokenizer, req, skip)
        req.text += new
        holdback = 0
        if req.params.stop and new and not req.finished:
            found = find_stop(req.text, len(new), req.params.stop)
            if found is not None:
                at, stop = found
                req.text = req.text[:at]
                req.stop_reason = stop
                self.scheduler.finish(req, FinishReason.STOP)
            else:
                holdback = max(len(s) for s in req.params.stop) - 1
        end = len(req.text) if req.finished else max(req.emitted_chars, len(req.text) - holdback)
        out = req.text[req.emitted_chars : end]
        req.emitted_chars = end
        return out

    def fail_all(self, error: str) -> list[RequestOutput]:
        """End every unfinished request with `error` (after a failed step); frees blocks."""
        sched = self.scheduler
        queues = [*sched.running, *sched.waiting, *sched.loading.values()]
        for req in [*queues, *sched.tier_loading.values()]:
            sched.finish(req, FinishReason.ERROR, error)
            sched.finished_now.append(req)
        now = time.monotonic()
        outputs = [self._output(req, [], now) for req in sched.finished_now]
        sched.finished_now.clear()
        return outputs

    # -- offline use -----------------------------------------------------------------
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Request]:
        """Run prompts to completion (offline); returns the finished requests in order."""
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        reqs = [
            self.add_request(f"offline-{i}-{id(prompts)}", list(p), sp)
            for i, (p, sp) in enumerate(zip(prompts, plist, strict=True))
        ]
        while self.has_unfinished():
            self.step()
        return reqs


def _step_work(s: ScheduledSequence) -> StepWork:
    req, work = s.request, s.work
    kind = work_kind(work.start_position, req.num_prompt_tokens, req.is_remote_prefill)
    return StepWork(req.request_id, kind, len(work.token_ids), len(work.draft_token_ids))
