"""Continuous batching with chunked prefill, prefix caching, preemption and speculation.

Each step: running requests first (decode tokens, with their draft tokens, then the next chunk
of prompts already started), then new requests in arrival order while the token budget
(`max_num_batched_tokens`) and the request cap (`max_num_seqs`) allow. Admission looks the
prompt up in the cache and applies the sizing rule of docs/design.md §8 (the whole prompt must
fit under the per-group caps). When a running request cannot get blocks, the most recently
admitted running request is preempted by recompute (its blocks return to the pool; its hashes
stay, so it resumes from its own cached prefix).

Token accounting follows `relaykv.common.messages.steps`: a sampling entry commits `n + a`
positions (its tokens and the accepted drafts); rejected drafts are rolled back simply by not
counting them, and sliding-window frees only ever use committed (processed) positions (§6).

The cache side of every request goes through the cache lifecycle (`kvcache.CacheLifecycle`,
docs/design.md §10): `add_request` on arrival, `admit` / `reserve` / `commit` / `preempt`
while it runs here, `release` when it ends. On a decode engine (P/D) a request whose prompt KV
comes from a prefill engine starts its load with `receive` and waits in `loading`
(WAITING_FOR_REMOTE_KV) until `load_finished` delivers it. A load holds its blocks but not a
running slot: a hung or unreachable prefill engine must not keep local work out
(`max_num_seqs` counts `running` only; the pool bounds loads, or `max_num_loads`). A delivered
load waits in `ready`, still holding its blocks, until a running slot is free; it then resumes
at N-1 (the last prompt token is recomputed for its logits) through `reserve`, like any
running request (docs/pd.md, "Slot hygiene").

A decode engine also computes prompts itself: a request that arrives without KV (a local
request, which the router sends under conditional disaggregation, docs/routing.md) or a load
that failed and is recomputed. Its prefill is chunked like a colocated one, with a per-step
cap (`max_local_prefill_tokens`) so the running streams' steps stay short; a local request
that the cap leaves out this step is passed over, so loads behind it still start.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from relaykv.common.messages.steps import SequenceOutput, SequenceWork
from relaykv.engine.connector import KVConnector
from relaykv.engine.metrics import EngineMetrics
from relaykv.engine.request import FinishReason, Request, RequestState
from relaykv.engine.scheduler_check import scheduler_problems
from relaykv.kvcache import CacheLifecycle, CacheRole, KVLoad

KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int = 4096
    kv_load_failure: str = "recompute"  # on a decode engine: recompute locally, or fail
    # Loads from prefill engines at once. None: no cap but the pool's blocks (as vLLM): a
    # cap would let one hung prefill engine delay loads from the healthy ones.
    max_num_loads: int | None = None
    # A decode engine's prompt tokens computed locally per step (None: no cap of its own,
    # as on a colocated or prefill engine; see the module docstring).
    max_local_prefill_tokens: int | None = None


@dataclass(slots=True)
class ScheduledSequence:
    request: Request
    work: SequenceWork


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        manager: CacheLifecycle,
        num_speculative_tokens: int = 0,
        connector: KVConnector | None = None,
        eos_token_ids: frozenset[int] = frozenset(),
        metrics: EngineMetrics | None = None,
    ) -> None:
        if config.kv_load_failure not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(f"kv_load_failure must be one of {KV_LOAD_FAILURE_POLICIES}")
        self.config = config
        self.manager = manager
        self.k = num_speculative_tokens
        self.connector = connector
        self.eos_token_ids = eos_token_ids
        self.metrics = metrics if metrics is not None else EngineMetrics()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.loading: dict[str, Request] = {}  # KV on its way: blocks held, no running slot
        self.ready: deque[Request] = deque()  # KV arrived: blocks held, waiting for a slot
        # A hit being loaded from the KV tier (docs/tier.md): blocks held, no running slot.
        self.tier_loading: dict[str, Request] = {}
        self.finished_now: list[Request] = []  # finished outside a step (aborts, failures)
        self.num_preemptions = 0

    # -- queue management ------------------------------------------------------------
    def add(self, req: Request) -> None:
        role = CacheRole.COLOCATED
        if req.is_prefill_only:
            role = CacheRole.PREFILL
        elif req.is_remote_prefill:
            role = CacheRole.DECODE
        req.cache = self.manager.add_request(req.request_id, req.prompt_ids, req.cache_salt, role)
        self.waiting.append(req)

    @property
    def num_unfinished(self) -> int:
        return (
            len(self.waiting)
            + len(self.running)
            + len(self.loading)
            + len(self.ready)
            + len(self.tier_loading)
        )

    def abort(self, request_id: str) -> Request | None:
        queues = [*self.running, *self.waiting, *self.loading.values(), *self.ready]
        for req in [*queues, *self.tier_loading.values()]:
            if req.request_id == request_id:
                self.finish(req, FinishReason.ABORT)
                return req
        return None

    def finish(self, req: Request, reason: FinishReason, error: str | None = None) -> None:
        """End a request and give its blocks back (or to the connector on a prefill engine)."""
        if req.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req.request_id in self.loading:
            del self.loading[req.request_id]
        elif req.request_id in self.tier_loading:
            del self.tier_loading[req.request_id]  # the cache releases it when the load ends
        elif req in self.ready:
            self.ready.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
            if req.is_remote_prefill and not req.admitted and self.connector is not None:
                self.connector.release_remote(req)  # P holds blocks this request never read
        req.state = RequestState.FINISHED
        req.finish_reason = reason
        req.error = error
        req.draft_token_ids = []
        assert req.cache is not None
        held = (
            self.connector is not None
            and req.is_prefill_only
            and reason in (FinishReason.LENGTH, FinishReason.STOP)
            and req.num_computed_tokens >= req.num_prompt_tokens
        )
        if held:
            assert self.connector is not None
            params = self.connector.prefill_finished(req)
            req.kv_transfer_params = params
            if params is None:
                self.manager.release(req.cache)
        else:
            self.manager.release(req.cache)

    # -- scheduling ------------------------------------------------------------------
    def schedule(self) -> list[ScheduledSequence]:
        self.settle_transfers()
        budget = self.config.max_num_batched_tokens
        cap = self.config.max_local_prefill_tokens
        local_left = cap if cap is not None else budget  # local prefill tokens left this step
        scheduled: list[ScheduledSequence] = []
        for req in list(self.running):
            if budget <= 0:
                break
            if req not in self.running:  # preempted by an earlier request of this loop
                continue
            local = cap is not None and self._prefilling_locally(req)
            if local and local_left <= 0:
                continue
            item = self._schedule_running(req, min(budget, local_left) if local else budget)
            if item is not None:
                scheduled.append(item)
                budget -= len(item.work.token_ids) + len(item.work.draft_token_ids)
                if local:
                    local_left -= self._count_local(item)
        # Loads delivered first: they already hold their blocks (docs/pd.md, "Slot hygiene").
        while self.ready and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.ready.popleft()
            req.state = RequestState.RUNNING
            self.running.append(req)
            item = self._schedule_running(req, budget)
            if item is None:  # the pool is short: it yielded its own blocks (preempted)
                break
            scheduled.append(item)
            budget -= len(item.work.token_ids)
        # Then new requests in arrival order. A remote-prefill request only starts its load
        # here (no running slot, no token budget); when loads are at their cap it is passed
        # over, so local requests behind it still start.
        i = 0
        while i < len(self.waiting):
            req = self.waiting[i]
            if req.is_remote_prefill and not req.admitted:
                cap = self.config.max_num_loads
                if cap is not None and len(self.loading) >= cap:
                    i += 1
                    continue
                if not self._admit_remote(req):
                    break
                continue
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if cap is not None and local_left <= 0:
                i += 1  # the local prefill cap is spent: loads behind it may still start
                continue
            first = not req.admitted
            item = self._admit(req, min(budget, local_left) if cap is not None else budget)
            if item is None:
                if req.request_id in self.tier_loading:
                    continue  # its hit loads from the KV tier first: no slot, no budget yet
                break
            scheduled.append(item)
            budget -= len(item.work.token_ids)
            if cap is not None:
                local_left -= self._count_local(item)
                self.metrics.local_requests += first
        return scheduled

    @staticmethod
    def _prefilling_locally(req: Request) -> bool:
        """A decode engine's request computing prompt tokens itself (not a delivered load,
        which recomputes only N-1)."""
        return not req.is_remote_prefill and req.num_computed_tokens < req.num_prompt_tokens

    def _count_local(self, item: ScheduledSequence) -> int:
        """Prompt tokens `item` computes on a decode engine (counted in the metrics)."""
        work, req = item.work, item.request
        n = max(0, min(req.num_prompt_tokens, work.start_position + len(work.token_ids))
                - work.start_position)
        self.metrics.local_prefill_tokens += n
        return n

    def _work(self, req: Request, n: int, drafts: list[int]) -> SequenceWork:
        start = req.num_computed_tokens
        end = start + n
        sample = end == req.num_tokens
        next_token = req.token_at(end) if (not sample and self.k) else None
        assert req.cache is not None
        return SequenceWork(
            request_id=req.request_id,
            token_ids=req.tokens(start, end),
            start_position=start,
            block_tables=[list(t) for t in req.cache.tables],
            sample=sample,
            sampling=req.params,
            draft_token_ids=list(drafts),
            next_token_id=next_token,
            # A prefill engine hands the request over after one token, and a request that
            # samples its last token now ends: no proposals for either (the draft still
            # writes its KV of the computed positions, which later requests reuse).
            propose=not req.is_prefill_only and not (
                sample and len(req.output_ids) + 1 >= req.params.max_tokens
            ),
            # A hit's last block made private at admission (§4 recompute): copied before
            # this step writes it; `commit` then drops the sources.
            kv_copies=list(req.cache.copies),
        )

    def _drafts_for(self, req: Request, n: int, budget: int) -> list[int]:
        if not req.draft_token_ids or req.num_computed_tokens + n != req.num_tokens:
            return []
        room = min(
            budget - n,
            req.params.max_tokens - len(req.output_ids) - 1,
            self.config.max_model_len - req.num_tokens - 1,
        )
        return req.draft_token_ids[: max(0, room)]

    def _lookahead(self, req: Request, n: int) -> int:
        """Slots the runner may write past the scheduled tokens (its draft proposals)."""
        if req.is_prefill_only or req.num_computed_tokens + n != req.num_tokens:
            return 0
        return self.k

    def _schedule_running(self, req: Request, budget: int) -> ScheduledSequence | None:
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if n <= 0:
            return None
        drafts = self._drafts_for(req, n, budget)
        assert req.cache is not None
        end = req.num_computed_tokens + n + len(drafts)
        while not self.manager.reserve(req.cache, end, lookahead=self._lookahead(req, n)):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return None
        return ScheduledSequence(req, self._work(req, n, drafts))

    def _admit(self, req: Request, budget: int) -> ScheduledSequence | None:
        assert req.cache is not None
        admission = self.manager.admit(
            req.cache,
            budget,
            lookahead=0 if req.is_prefill_only else self.k,
            must_fit=min(req.num_tokens, self.config.max_model_len),
        )
        if admission is None:
            return None
        req.num_computed_tokens = admission.start
        if not req.admitted:
            req.num_cached_tokens = admission.start
        req.admitted = True
        self.waiting.remove(req)
        if admission.loads_from_tier:
            # Like a P/D load: it waits, holding its blocks, until `tier_poll` reports it.
            req.state = RequestState.WAITING_FOR_REMOTE_KV
            self.tier_loading[req.request_id] = req
            return None
        req.state = RequestState.RUNNING
        self.running.append(req)
        return ScheduledSequence(req, self._work(req, admission.num_tokens, []))

    def _preempt(self, req: Request) -> None:
        assert req.cache is not None
        self.running.remove(req)
        self.manager.preempt(req.cache)
        req.num_computed_tokens = 0
        req.draft_token_ids = []
        req.num_preemptions += 1
        req.state = RequestState.WAITING
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- decode side of P/D ----------------------------------------------------------------
    def _admit_remote(self, req: Request) -> bool:
        assert req.cache is not None
        load = self.manager.receive(req.cache)
        if load is None:
            return False
        self.waiting.remove(req)
        req.admitted = True
        req.load_start_time = time.monotonic()
        req.num_cached_tokens = load.local_tokens
        req.num_external_tokens = max(0, req.num_prompt_tokens - 1 - load.local_tokens)
        req.state = RequestState.WAITING_FOR_REMOTE_KV
        self.loading[req.request_id] = req
        if self.connector is None:
            raise RuntimeError("a remote-prefill request reached an engine without a connector")
        if load.needs_transfer:
            self.connector.start_load(req, load)
        else:
            # Everything is local or already on its way: P may free its blocks now.
            self.connector.release_remote(req)
            if load.delivered:
                self._loaded(req, load)
        return True

    def settle_transfers(self) -> None:
        for cache_req, ok in self.manager.tier_poll():
            req = self.tier_loading.pop(cache_req.request_id, None)
            if req is None:
                continue
            req.state = RequestState.WAITING
            if ok:
                self.ready.append(req)  # resumes at its hit once a running slot is free
            else:
                # The tier lost the blocks: admit it again (the tier forgot those keys).
                req.num_computed_tokens = 0
                req.admitted = False
                self.waiting.appendleft(req)
        for delivered in self.manager.tier_delivered():  # P/D loads whose tier part ended last
            remote = self.loading.get(delivered.request.request_id)
            if remote is not None:
                self._loaded(remote, delivered)
        if self.connector is None:
            return
        waiting = [r for r in self.waiting if r.is_remote_prefill and not r.admitted]
        if waiting:
            self.connector.keep_alive(waiting)
        for load, ok in self.connector.poll():
            for delivered in self.manager.load_finished(load, ok):
                req = self.loading.get(delivered.request.request_id)
                if req is not None:
                    self._loaded(req, delivered)

    def _loaded(self, req: Request, load: KVLoad) -> None:
        """`load` was delivered to `req`: run it (resuming at N-1), or handle the failure."""
        del self.loading[req.request_id]
        if load.needs_transfer and req.load_start_time is not None:
            self.metrics.kv_transfer.observe(time.monotonic() - req.load_start_time)
        assert req.cache is not None
        if load.ok:
            # Full-prompt rule: recompute the last prompt token for its logits (§7), once a
            # running slot is free (schedule()).
            req.num_computed_tokens = req.num_prompt_tokens - 1
            req.state = RequestState.WAITING
            self.ready.append(req)
            return
        if self.config.kv_load_failure == "fail":
            self.loading[req.request_id] = req  # so finish() finds it
            self.finish(req, FinishReason.ERROR, "KV transfer from the prefill engine failed")
            self.finished_now.append(req)
            return
        # Recompute locally: forget the remote prompt KV and prefill here like a colocated
        # request (whatever D holds locally is still found by the lookup).
        self.manager.release(req.cache)
        req.kv_transfer_params = None
        req.num_computed_tokens = 0
        req.num_external_tokens = 0
        req.cache = self.manager.add_request(
            req.request_id, req.prompt_ids, req.cache_salt, recompute=True
        )
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)

    def check(self) -> list[str]:
        """Violations of the scheduler's invariants (tests run this after every step)."""
        queues = {
            "waiting": self.waiting,
            "running": self.running,
            "loading": self.loading.values(),
            "ready": self.ready,
            "tier_loading": self.tier_loading.values(),
        }
        return scheduler_problems(
            queues, self.manager, self.config.max_num_seqs, self.config.max_num_loads
        )

    # -- after a step ------------------------------------------------------------------
    def update(
        self, scheduled: list[ScheduledSequence], outputs: Sequence[SequenceOutput]
    ) -> list[tuple[Request, list[int]]]:
        """Commit a step: advance positions, append sampled tokens up to a stop condition,
        hash what was written and slide the windows; finish requests that stopped.

        Returns each request with its newly appended tokens. Stop strings need text and are
        the engine's (it calls `finish`).
        """
        produced: list[tuple[Request, list[int]]] = []
        for item, out in zip(scheduled, outputs, strict=True):
            req, work = item.request, item.work
            if req.finished or req not in self.running:
                continue  # aborted or preempted while the step ran
            assert req.cache is not None
            new_tokens: list[int] = []
            stop: tuple[FinishReason, int | None] | None = None
            if work.sample:
                accepted = out.num_accepted_tokens
                req.num_computed_tokens = work.start_position + len(work.token_ids) + accepted
                for token in out.token_ids:
                    req.output_ids.append(token)
                    new_tokens.append(token)
                    stop = self._stop_condition(req, token)
                    if stop is not None:
                        break
                if out.logprobs:
                    req.logprobs.extend(out.logprobs[: len(new_tokens)])
                req.draft_token_ids = [] if stop else list(out.draft_token_ids)
            else:
                req.num_computed_tokens = work.start_position + len(work.token_ids)
            self.manager.commit(req.cache, req.num_computed_tokens, new_tokens)
            if stop is not None:
                req.stop_reason = stop[1]
                self.finish(req, stop[0])
            produced.append((req, new_tokens))
        return produced

    def _stop_condition(self, req: Request, token: int) -> tuple[FinishReason, int | None] | None:
        params = req.params
        if len(req.output_ids) >= params.min_tokens:
            if token in params.stop_token_ids:
                return FinishReason.STOP, token
            if token in self.eos_token_ids and not params.ignore_eos:
                return FinishReason.STOP, None
        if len(req.output_ids) >= params.max_tokens:
            return FinishReason.LENGTH, None
        if req.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH, None
        return None
