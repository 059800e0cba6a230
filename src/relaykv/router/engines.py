"""What the router knows of each engine between requests (docs/routing.md).

`Engines` owns one `EngineTracker` per engine URL. Each health tick (`refresh`) reads the
engine's `/v1/kv_cache_info` (geometry, role, P/D policy, KV event endpoints, instance id)
and `/metrics` (queue, KV usage); with cache-aware routing it follows the engine's KV events
into an `EngineIndex` (over CURVE, with keys derived from the cluster secret, when the engine
publishes off its host). A new instance id (the engine restarted) drops the old index. An
engine whose event stream disconnects leaves the rotation at once (`kv_subscriber.py`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from relaykv.common.messages.geometry_json import parse_geometry_json
from relaykv.common.plumbing.derived_keys import CurveKeys
from relaykv.kvcache import DEFAULT_PD_POLICY, Geometry, GroupSpec, PDPolicy
from relaykv.router.backends import Backend
from relaykv.router.holders import KeyHolders
from relaykv.router.index import EngineIndex
from relaykv.router.kv_subscriber import EventSubscriber

log = logging.getLogger(__name__)


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

    @property
    def scored_index(self) -> EngineIndex | None:
        """The index a prompt is scored against: only one its events keep current."""
        return self.index if self.subscriber is not None else None

    def describe(self) -> dict[str, Any]:
        index = self.index
        return {
            "indexed_blocks": index.num_blocks if index else None,
            "event_batches": index.batches if index else 0,
            "gaps": index.gaps if index else 0,
            "resets": index.resets if index else 0,
            "decisions": self.decisions,
            "routed_hit_tokens": self.hit_tokens,
            "waiting": self.waiting,
            "kv_usage": self.kv_usage,
        }


class Engines:
    """Per engine URL, its tracker; `follow_events`: subscribe to their KV events."""

    def __init__(
        self,
        holders: KeyHolders,
        follow_events: bool,
        api_key: str | None = None,
        kv_secret: bytes | None = None,
        prefill_holders: KeyHolders | None = None,
    ) -> None:
        # Which engines of a role hold each key (router/holders.py): decode, prefill.
        prefill = prefill_holders if prefill_holders is not None else KeyHolders()
        self.holders = {"decode": holders, "prefill": prefill}
        self.follow_events = follow_events
        self.api_key = api_key
        # subscriber keys for a CURVE event stream (an engine publishing off its host)
        self.curve = CurveKeys.from_secret(kv_secret) if kv_secret else None
        self.trackers: dict[str, EngineTracker] = {}

    def tracker(self, backend: Backend) -> EngineTracker:
        t = self.trackers.get(backend.url)
        if t is None:
            t = self.trackers[backend.url] = EngineTracker(backend)
        return t

    async def refresh(self, client: httpx.AsyncClient, backends: list[Backend]) -> None:
        await asyncio.gather(*(self._refresh_one(client, b) for b in backends))

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
            geometry = parse_geometry_json(info.get("geometry") or {}, GroupSpec, Geometry)
            policy = PDPolicy.parse(str(info.get("pd_policy", DEFAULT_PD_POLICY)))
            reach = info.get("sibling_reach", 0)
            if type(reach) is not int or reach < 0:
                raise ValueError(f"sibling_reach must be a count of tokens, got {reach!r}")
        except ValueError as exc:
            log.warning("engine %s: %s; routing it on load alone", backend.url, exc)
            t.index = None
            return
        role = str(info.get("role", "colocated"))
        t.index = EngineIndex(
            geometry,
            role,
            policy,
            holders=self.holders.get(role),
            sibling_reach=reach,
        )
        events = info.get("kv_events")
        if not self.follow_events or not isinstance(events, dict):
            return
        curve = None
        if events.get("curve"):
            if self.curve is None:
                log.warning(
                    "engine %s publishes KV events with CURVE and this router has no cluster "
                    "secret (--kv-secret-file): routing it on load alone", backend.url
                )
                return
            curve = self.curve
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
            curve=curve,
        )
        t.subscriber.start()

    async def stop(self) -> None:
        for t in self.trackers.values():
            if t.subscriber is not None:
                await t.subscriber.stop()
                t.subscriber = None

    def describe(self) -> dict[str, Any]:
        return {url: t.describe() for url, t in self.trackers.items()}


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
