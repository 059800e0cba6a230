"""The router's engine choice for a request (docs/routing.md).

`Routing.pick(pool, tried, prompt)` is the one place an engine is chosen: it views every
healthy, untried engine of the pool (its index from `engines.py`, its load, the prefixes in
flight there from `pending.py`), lets `scoring.choose_engine` and the pool's policy
(`policy.py`) choose, records the decision and returns it as a `Choice` (`decision.py`), which
the request path carries down. `decide_path` then settles, for a decode engine's choice, whether
that engine prefills the request itself (conditional disaggregation, `policy.ConditionalRule`).
The health tick (`refresh`) keeps the engines' indexes and loads current and fetches the
tokenizer prompts are read with (`prompt.py`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from typing import Any

import httpx

from relaykv.router.backends import Backend, BackendPool
from relaykv.router.decision import Choice, Decision
from relaykv.router.engines import Engines
from relaykv.router.holders import KeyHolders
from relaykv.router.pending import InFlightPrefixes
from relaykv.router.policy import (
    CacheAwareWeights,
    ConditionalRule,
    PathChoice,
    RoutingPolicy,
    make_policy,
)
from relaykv.router.prompt import Prompt, PromptReader
from relaykv.router.scoring import EngineView, choose_engine

RECENT_DECISIONS = 1024  # per-request records kept for `GET /routing?recent=1`


class Routing:
    def __init__(
        self,
        mode: str = "cache-aware",
        weights: CacheAwareWeights | None = None,
        api_key: str | None = None,
        conditional: ConditionalRule | None = None,
        kv_secret: bytes | None = None,
    ) -> None:
        """`kv_secret`: the cluster secret, for KV events published off an engine's host."""
        self.mode = mode
        self.weights = weights
        self.conditional = conditional or ConditionalRule()
        self.paths = {"local": 0, "pd": 0}  # decode choices by path
        cache_aware = mode == "cache-aware"
        self.policies: dict[str, RoutingPolicy] = {}
        # Which engines hold each key, per role: one pass scores a prompt on all of them.
        self.holders = KeyHolders()  # decode engines
        self.prefill_holders = KeyHolders()
        self.engines = Engines(
            self.holders,
            follow_events=cache_aware,
            api_key=api_key,
            kv_secret=kv_secret,
            prefill_holders=self.prefill_holders,
        )
        self.prompts = PromptReader(cache_aware, api_key)
        self.in_flight = InFlightPrefixes()  # prompts sent to engines, not yet answered
        self.peak_load_ratio: dict[str, float] = {}  # per role: max chosen load / mean load
        self.recent: deque[Decision] = deque(maxlen=RECENT_DECISIONS)

    def pick(self, pool: BackendPool, tried: set[Backend], prompt: Prompt | None) -> Choice | None:
        """The engine of `pool` for `prompt` among the healthy ones not in `tried`."""
        backends = [b for b in pool.backends if b.healthy and b not in tried]
        if not backends:
            return None
        policy = self.policies.get(pool.role)
        if policy is None:
            policy = self.policies[pool.role] = make_policy(self.mode, self.weights)
        views = [self._view(b, prompt) for b in backends]
        scored = choose_engine(policy, prompt, views)
        backend = backends[scored.choice]
        index = views[scored.choice].index
        t = self.engines.tracker(backend)
        t.decisions += 1
        t.hit_tokens += scored.exact or 0
        head = b""
        if prompt is not None and index is not None:
            keys = prompt.request_for(index).keys(0)
            head = keys[0] if keys else b""
        record = Decision(
            pool.role,
            backend.url,
            head.hex()[:12],
            len(prompt.tokens) if prompt else 0,
            scored.scored_hit,
        )
        self.recent.append(record)
        self._note_balance(pool, backend)
        return Choice(backend, record, prompt, index, self.in_flight, scored.bound)

    def decide_path(self, choice: Choice, force_pd: str = "") -> PathChoice:
        """Whether the decode engine of `choice` prefills the request itself (a local
        request) or P computes it: `policy.ConditionalRule` on the engine's hybrid-exact
        local hit (`EngineIndex.local_hit`) and the local prefill queued there. `force_pd`:
        a reason this request must go through P (its local attempt failed). Recorded in
        the choice's decision."""
        prompt, index = choice.prompt, choice.index
        n = len(prompt.tokens) if prompt is not None else 0
        if force_pd:
            path = PathChoice(False, -1, force_pd)
        else:
            rule, hit = self.conditional, None
            known = prompt is not None and index is not None
            # The hit bound the policy scored the engine with also bounds its local hit (a
            # local hit is a run of held full-group blocks): a suffix it proves too long
            # settles the path without kvcache's lookup (docs/routing.md "Cost").
            settled = rule.settled_by_bound(n, choice.hit_bound) if known else None
            if settled is not None:
                path = settled
            else:
                if rule.mode != "always" and prompt is not None and index is not None:
                    hit = index.local_hit(prompt.request_for(index), prompt.counts_for(index))
                queued = self.in_flight.queued_prefill(choice.backend.url)
                # This router's streams on D now (requests decoding past their first
                # token there; this request is counted once it is sent).
                path = rule.decide(n, hit, queued, choice.backend.streams)
        record = choice.record
        record.path, record.why = path.path, path.why
        record.local_suffix = path.suffix
        if path.local:
            choice.local_prefill = max(0, path.suffix)
        self.paths[path.path] += 1
        return path

    def _view(self, backend: Backend, prompt: Prompt | None) -> EngineView:
        t = self.engines.tracker(backend)
        index = t.scored_index if prompt is not None else None
        computing = 0
        # Only prefixes in flight there give a resume point: the cap is asked for then.
        if prompt is not None and index is not None and self.in_flight.count(backend.url):
            cap = index.resume_cap(prompt.request_for(index))
            computing = self.in_flight.hit(backend.url, prompt, index, cap)
        return EngineView(index, backend.in_flight, t.waiting, t.kv_usage, computing)

    def _note_balance(self, pool: BackendPool, chosen: Backend) -> None:
        """Balance record: the chosen engine's in-flight count against the pool's mean, once
        the pool has at least one request per engine in flight."""
        total = sum(b.in_flight for b in pool.backends) + 1
        if total >= len(pool.backends):
            ratio = (chosen.in_flight + 1) * len(pool.backends) / total
            self.peak_load_ratio[pool.role] = max(self.peak_load_ratio.get(pool.role, 0.0), ratio)

    # -- background ----------------------------------------------------------------------
    async def refresh(self, client: httpx.AsyncClient, pools: list[BackendPool]) -> None:
        backends = [b for pool in pools for b in pool.backends]
        await self.engines.refresh(client, backends)
        await self.prompts.load_tokenizer(client, backends)

    async def stop(self) -> None:
        await self.engines.stop()

    def describe(self, recent: bool = False) -> dict[str, Any]:
        rule = self.conditional
        return {
            "mode": self.mode,
            "disaggregation": {
                "mode": rule.mode,
                "max_suffix": rule.max_suffix,
                "max_queued_prefill": rule.queue_cap,
                "max_running": rule.max_running,
                "paths": dict(self.paths),
            },
            **({"recent": [asdict(d) for d in self.recent]} if recent else {}),
            "peak_load_ratio": self.peak_load_ratio,
            "prefix_waits": self.in_flight.waits,
            "engines": self.engines.describe(),
        }
