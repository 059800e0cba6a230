"""The router's engine choice: prompt tokens, per-engine indexes, the policy (docs/routing.md).

`Routing` owns one `EngineTracker` per engine URL. Each health tick (`refresh`) reads the
engine's `/v1/kv_cache_info` (geometry, role, P/D policy, KV event endpoints, instance id)
and `/metrics` (queue, KV usage); with cache-aware routing it follows the engine's KV events
into an `EngineIndex`. A new instance id (the engine restarted) drops the old index.

`pick(pool, tried, prompt)` scores every healthy, untried engine of the pool: the usable hit
of the prompt there (kvcache's lookup over the index; 0 for an engine without one, which is
then judged on load alone) and its load, and lets the policy choose.

Prompt tokens come from the request: a completion's token ids as sent, or its text encoded
with the engine's own tokenizer (fetched once from `/v1/kv_cache_info/tokenizer`, loaded with
`tokenizers`). Chat messages are tokenized by an engine's `POST /tokenize` (its own chat
template), one round trip; if that fails the request is routed on load alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import httpx

from relaykv.kvcache import DEFAULT_PD_POLICY, PDPolicy
from relaykv.kvcache.accel import int32_bytes
from relaykv.kvcache.hashing import PrefixChains
from relaykv.router.backends import Backend, BackendPool
from relaykv.router.decision import Decision
from relaykv.router.holders import KeyHolders
from relaykv.router.index import EngineIndex, geometry_from_json
from relaykv.router.kv_subscriber import EventSubscriber
from relaykv.router.pending import LOAD_WAIT_S, InFlight, InFlightPrefixes
from relaykv.router.policy import (
    CacheAwarePolicy,
    CacheAwareWeights,
    Candidate,
    RoutingPolicy,
    make_policy,
)
from relaykv.router.prompt import Prompt

log = logging.getLogger(__name__)

RECENT_DECISIONS = 1024  # per-request records kept for `GET /routing?recent=1`


@dataclass(eq=False)
class EngineTracker:
    backend: Backend
    instance: str | None = None
    index: EngineIndex | None = None
    subscriber: EventSubscriber | None = None
    waiting: int = 0
    kv_usage: float = 0.0
    decisions: int = 0
    hit_tokens: int = 0  # usable tokens of the prompts routed here (as scored)


def _token_ids(raw: list[Any]) -> bool:
    """Whether a body's `prompt` list is token ids the router can hash: exact ints within
    int32 (one C pass where kvcache's accelerator is built). Anything else is routed on
    load alone, and the engine answers it (a 400 for ids it cannot take)."""
    try:
        int32_bytes(raw, strict=True)
    except (TypeError, OverflowError):
        return False
    return True


class Routing:
    def __init__(
        self,
        mode: str = "cache-aware",
        weights: CacheAwareWeights | None = None,
        api_key: str | None = None,
    ) -> None:
        self.mode = mode
        self.weights = weights
        self.api_key = api_key
        self.policies: dict[str, RoutingPolicy] = {}
        self.trackers: dict[str, EngineTracker] = {}
        self.peak_load_ratio: dict[str, float] = {}  # per role: max chosen load / mean load
        self.holders = KeyHolders()  # decode engines' keys, to bound their hits together
        self.chains = PrefixChains()  # hash chains of recent prompts' shared prefixes
        self.in_flight = InFlightPrefixes()  # prompts sent to engines, not yet answered
        self.prefix_waits = 0  # decode sends held for a load of the same prefix
        self._tokenizer: Any = None
        self._tokenizer_info: dict[str, Any] | None = None
        self.recent: deque[Decision] = deque(maxlen=RECENT_DECISIONS)

    def tracker(self, backend: Backend) -> EngineTracker:
        t = self.trackers.get(backend.url)
        if t is None:
            t = self.trackers[backend.url] = EngineTracker(backend)
        return t

    # -- prompts ---------------------------------------------------------------------
    def prompt(self, body: dict[str, Any]) -> Prompt | None:
        if self.mode != "cache-aware":
            return None
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
            raw = raw[0]
        if isinstance(raw, list) and raw and _token_ids(raw):
            return Prompt(raw, salt, self.chains)
        if isinstance(raw, str) and raw and self._tokenizer is not None:
            try:
                ids = self._tokenizer.encode(raw, add_special_tokens=True).ids
            except (TypeError, ValueError):  # e.g. a lone surrogate: the engine's 400 to give
                return None
            info = self._tokenizer_info or {}
            bos = info.get("bos_token_id")
            if info.get("add_bos") and bos is not None and (not ids or ids[0] != bos):
                ids = [bos, *ids]
            return Prompt(list(ids), salt, self.chains)
        return None

    async def chat_prompt(
        self,
        client: httpx.AsyncClient,
        pool: BackendPool,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> Prompt | None:
        """A chat request's prompt tokens from an engine's `POST /tokenize` (the engine
        applies its own chat template); None (load-only routing) when it cannot answer."""
        if self.mode != "cache-aware" or not isinstance(body.get("messages"), list):
            return None
        backend = next((b for b in pool.backends if b.healthy), None)
        if backend is None:
            return None
        try:
            resp = await client.post(
                f"{backend.url}/tokenize", json=body, headers=headers, timeout=5.0
            )
            tokens = resp.json().get("tokens") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        if not isinstance(tokens, list) or not tokens or not all(type(t) is int for t in tokens):
            return None
        salt = body.get("cache_salt")
        return Prompt(tokens, salt if isinstance(salt, str) else None, self.chains)

    # -- choice ------------------------------------------------------------------------
    def pick(self, pool: BackendPool, tried: set[Backend], prompt: Prompt | None) -> Backend | None:
        backends = [b for b in pool.backends if b.healthy and b not in tried]
        if not backends:
            return None
        policy = self.policies.get(pool.role)
        if policy is None:
            policy = self.policies[pool.role] = make_policy(self.mode, self.weights)
        if prompt is not None:
            prompt.recount()  # events since an earlier pick (a retry) change the holders
        candidates = []
        indexes: list[EngineIndex | None] = []
        pending: list[int] = []  # hits from prefixes in flight there (router/pending.py)
        for b in backends:
            t = self.tracker(b)
            index = t.index if prompt is not None and t.subscriber is not None else None
            indexes.append(index)
            bound = computing = 0
            if prompt is not None and index is not None:
                req = prompt.request_for(index)
                counts = partial(prompt.counts, self.holders, index)
                bound = index.hit_bound(req, counts)
                computing = self.in_flight.hit(b.url, prompt, index, index.resume_cap(req))
                bound = max(bound, computing)
            pending.append(computing)
            candidates.append(
                Candidate(
                    hit_tokens=bound,
                    prompt_tokens=len(prompt.tokens) if prompt else 0,
                    in_flight=b.in_flight,
                    waiting=t.waiting,
                    kv_usage=t.kv_usage,
                    cached_blocks=index.num_blocks if index is not None else 0,
                )
            )
        exact: dict[int, int] = {}

        def exact_hit(i: int) -> int:
            index = indexes[i]
            assert prompt is not None and index is not None
            counts = partial(prompt.counts, self.holders, index)
            exact[i] = max(index.usable_hit(prompt.request_for(index), counts), pending[i])
            return exact[i]

        if isinstance(policy, CacheAwarePolicy):
            choice = policy.choose_lazy(candidates, exact_hit)
        else:
            choice = policy.choose(candidates)
        t = self.tracker(backends[choice])
        t.decisions += 1
        t.hit_tokens += exact.get(choice, 0)
        chosen_index = indexes[choice]
        head = b""
        if prompt is not None and chosen_index is not None:
            keys = prompt.request_for(chosen_index).keys(0)
            head = keys[0] if keys else b""
        self.recent.append(
            Decision(
                pool.role,
                backends[choice].url,
                head.hex()[:12],
                len(prompt.tokens) if prompt else 0,
                exact.get(choice, -1 if candidates[choice].hit_tokens else 0),
            )
        )
        # Balance record: the chosen engine's in-flight count against the pool's mean, once
        # the pool has at least one request per engine in flight.
        total = sum(b.in_flight for b in pool.backends) + 1
        if total >= len(pool.backends):
            ratio = (backends[choice].in_flight + 1) * len(pool.backends) / total
            self.peak_load_ratio[pool.role] = max(self.peak_load_ratio.get(pool.role, 0.0), ratio)
        return backends[choice]

    def in_flight_on(self, backend: Backend, prompt: Prompt | None) -> InFlight:
        """`prompt`, just routed to `backend` (the latest `pick`), in flight there until the
        engine answers (router/pending.py)."""
        return InFlight(self.in_flight, backend.url, prompt, self.last_decision)

    async def await_prefix_load(
        self, backend: Backend, prompt: Prompt | None, entry: InFlight
    ) -> None:
        """Before a decode engine takes `prompt`: wait (bounded) for the loads of the same
        prefix that went there before `entry` to be answered, unless its index already
        holds as much (router/pending.py)."""
        t = self.tracker(backend)
        index = t.index
        if prompt is None or index is None or t.subscriber is None:
            return
        waits = self.in_flight.awaited(backend.url, prompt, index, entry.token)
        if not waits:
            return
        req = prompt.request_for(index)
        cap = index.resume_cap(req)
        if index.usable_hit(req) >= self.in_flight.hit(backend.url, prompt, index, cap):
            return
        self.prefix_waits += 1
        # The first of them to load makes the shared prefix local (no convoy behind each
        # one); the request counts on the engine meanwhile, so others spread.
        tasks = [asyncio.ensure_future(w.wait()) for w in waits]
        backend.in_flight += 1
        try:
            await asyncio.wait(tasks, timeout=LOAD_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            backend.in_flight -= 1
            for task in tasks:
                task.cancel()

    # -- background ----------------------------------------------------------------------
    async def refresh(self, client: httpx.AsyncClient, pools: list[BackendPool]) -> None:
        backends = [b for pool in pools for b in pool.backends]
        await asyncio.gather(*(self._refresh_one(client, b) for b in backends))
        if self.mode == "cache-aware" and self._tokenizer_info is None:
            await self._load_tokenizer(client, backends)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _refresh_one(self, client: httpx.AsyncClient, backend: Backend) -> None:
        t = self.tracker(backend)
        if not backend.healthy:
            return
        try:
            resp = await client.get(
                f"{backend.url}/v1/kv_cache_info", headers=self._headers(), timeout=2.0
            )
            info = resp.json() if resp.status_code == 200 else None
            metrics = await client.get(f"{backend.url}/metrics", timeout=2.0)
        except (httpx.HTTPError, ValueError):
            return
        if metrics.status_code == 200:
            t.waiting, t.kv_usage = _load_from_metrics(metrics.text)
        if not isinstance(info, dict) or info.get("instance") == t.instance:
            return
        await self._follow(t, backend, info)

    async def _follow(self, t: EngineTracker, backend: Backend, info: dict[str, Any]) -> None:
        """A new engine instance: a new, empty index and a subscription to its events."""
        if t.subscriber is not None:
            await t.subscriber.stop()
            t.subscriber = None
        if t.index is not None:
            t.index.close()
        t.instance = info.get("instance")
        try:
            geometry = geometry_from_json(info.get("geometry") or {})
            policy = PDPolicy.parse(str(info.get("pd_policy", DEFAULT_PD_POLICY)))
        except ValueError as exc:
            log.warning("engine %s: %s; routing it on load alone", backend.url, exc)
            t.index = None
            return
        role = str(info.get("role", "colocated"))
        t.index = EngineIndex(
            geometry,
            role,
            policy,
            holders=self.holders if role == "decode" else None,
        )
        events = info.get("kv_events")
        if self.mode != "cache-aware" or not isinstance(events, dict):
            return
        host = urlsplit(backend.url).hostname or "127.0.0.1"
        endpoint = _reachable(str(events.get("endpoint")), host)
        replay = events.get("replay_endpoint")

        def down(reason: str) -> None:
            backend.healthy = False
            backend.last_error = reason
            log.warning("%s engine %s out of rotation: %s", backend.role, backend.url, reason)

        t.subscriber = EventSubscriber(
            t.index,
            endpoint,
            _reachable(replay, host) if replay else None,
            str(events.get("topic", "")),
            on_down=down,
        )
        t.subscriber.start()

    async def _load_tokenizer(self, client: httpx.AsyncClient, backends: list[Backend]) -> None:
        for b in backends:
            if not b.healthy:
                continue
            try:
                resp = await client.get(
                    f"{b.url}/v1/kv_cache_info/tokenizer", headers=self._headers(), timeout=10.0
                )
                info = resp.json() if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(info, dict) and isinstance(info.get("json"), str):
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_str(info["json"])
                self._tokenizer_info = info
                return
            self._tokenizer_info = {}  # the engine has no tokenizer: text is load-only
            return

    async def stop(self) -> None:
        for t in self.trackers.values():
            if t.subscriber is not None:
                await t.subscriber.stop()
                t.subscriber = None

    @property
    def last_decision(self) -> Decision:
        """The record of the latest `pick` (read it before the next await)."""
        return self.recent[-1]

    def describe(self, recent: bool = False) -> dict[str, Any]:
        return {
            "mode": self.mode,
            **({"recent": [asdict(d) for d in self.recent]} if recent else {}),
            "peak_load_ratio": self.peak_load_ratio,
            "prefix_waits": self.prefix_waits,
            "engines": {
                url: {
                    "indexed_blocks": t.index.num_blocks if t.index else None,
                    "event_batches": t.index.batches if t.index else 0,
                    "gaps": t.index.gaps if t.index else 0,
                    "resets": t.index.resets if t.index else 0,
                    "decisions": t.decisions,
                    "routed_hit_tokens": t.hit_tokens,
                    "waiting": t.waiting,
                    "kv_usage": t.kv_usage,
                }
                for url, t in self.trackers.items()
            },
        }


def _reachable(endpoint: str, host: str) -> str:
    """An endpoint bound on every interface is reached at the engine's own host."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"):
        if endpoint.startswith(wildcard):
            return f"tcp://{host}:" + endpoint.removeprefix(wildcard)
    return endpoint


def _load_from_metrics(text: str) -> tuple[int, float]:
    waiting, usage = 0, 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_waiting"):
            waiting = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("vllm:kv_cache_usage_perc"):
            usage = float(line.rsplit(" ", 1)[1])
    return waiting, usage
