"""The simulated router's engine choice: `relaykv router`'s own policies and index.

Per role, a `relaykv.router.backends.BackendPool` holds the engines and their in-flight
counts (the router's bookkeeping) and a `relaykv.router.policy` policy chooses among the
candidates: `cache-aware` (the router's default: usable hit vs load vs KV usage),
`least-loaded` or `round-robin` (`--routing`). Each engine's `EngineIndex` is the router's
own, fed by the engine's KV events (the cache manager's event sink) with no delay, and
scored as the router does: the index's cheap `hit_bound`, then its exact `usable_hit`
(kvcache's lookup, per role and P/D policy) only where the bound can win. The
engine's queue and KV usage are read at the moment of the decision (the real router sees
them at its last health tick: simulator.md "What is not modelled"). `path` applies the
router's `ConditionalRule` to a chosen decode engine (its hybrid-exact local hit from the
index, the local prefill queued there, the router's streams decoding there), as
`Routing.decide_path` does.
"""

from __future__ import annotations

from collections.abc import Callable

from relaykv.kvcache import KVEvent
from relaykv.router.backends import Backend, BackendPool
from relaykv.router.index import EngineIndex
from relaykv.router.policy import ROUTING_MODES, ConditionalRule, PathChoice, make_policy
from relaykv.router.prompt import Prompt
from relaykv.router.scoring import EngineView, choose_engine
from relaykv.sim.engine import SimEngine

__all__ = ["ROUTING_MODES", "SimRouter"]


class SimRouter:
    def __init__(
        self,
        mode: str,
        pools: dict[str, list[SimEngine]],
        conditional: ConditionalRule | None = None,
    ) -> None:
        self.mode = mode
        self.conditional = conditional or ConditionalRule("always")
        self.queued: dict[str, int] = {}  # per decode engine, local prefill tokens queued
        # Per decode engine, the requests there that ask for more than one token (the
        # router's `Backend.streams`), and each one's engine by request id.
        self.streams: dict[str, int] = {}
        self._stream_of: dict[str, str] = {}
        self._queued_by: dict[str, tuple[str, int]] = {}  # request id -> (engine, tokens)
        self.engines = {e.name: e for engines in pools.values() for e in engines}
        self.pools = {role: BackendPool(role, [e.name for e in es]) for role, es in pools.items()}
        self.policies = {role: make_policy(mode) for role in pools}
        self.indexes: dict[str, EngineIndex] = {}
        if mode == "cache-aware":
            for engine in self.engines.values():
                manager = engine.manager
                index = EngineIndex(
                    manager.geometry, engine.role, manager.pd_policy,
                    sibling_reach=manager.sibling_reach,
                )
                engine.manager.set_event_sink(_feeder(index))
                self.indexes[engine.name] = index
        self.backends: dict[str, Backend] = {
            b.url: b for pool in self.pools.values() for b in pool.backends
        }

    def pick(self, role: str, tokens: list[int]) -> SimEngine:
        """The engine of `role` the router sends this prompt to (counted in flight): the
        router's own scoring and choice (`relaykv.router.scoring.choose_engine`)."""
        backends = self.pools[role].backends
        # One engine: every policy picks it, so skip scoring (the hashing and lookups).
        prompt = Prompt(tokens) if self.indexes and len(backends) > 1 else None
        views = [
            EngineView(
                self.indexes.get(b.url) if prompt else None,
                b.in_flight,
                waiting=len(self.engines[b.url].scheduler.waiting),
                kv_usage=self.engines[b.url].manager.usage(),
            )
            for b in backends
        ]
        backend = backends[choose_engine(self.policies[role], prompt, views).choice]
        backend.in_flight += 1
        backend.requests += 1
        return self.engines[backend.url]

    def done(self, engine: SimEngine) -> None:
        self.backends[engine.name].in_flight -= 1

    def path(self, engine: SimEngine, tokens: list[int]) -> PathChoice:
        """The router's path rule for `tokens` on decode engine `engine`."""
        index = self.indexes.get(engine.name)
        hit = None
        if index is not None and self.conditional.mode != "always":
            hit = index.local_hit(Prompt(tokens).request_for(index))
        return self.conditional.decide(
            len(tokens), hit, self.queued.get(engine.name, 0), self.streams.get(engine.name, 0)
        )

    def stream(self, engine: SimEngine, request_id: str, max_tokens: int) -> None:
        """The request is sent to decode engine `engine`: a stream there until `unstream`
        when it asks for more than one token."""
        if max_tokens > 1:
            self._stream_of[request_id] = engine.name
            self.streams[engine.name] = self.streams.get(engine.name, 0) + 1

    def unstream(self, request_id: str) -> None:
        name = self._stream_of.pop(request_id, None)
        if name is not None:
            self.streams[name] -= 1

    def queue(self, engine: SimEngine, request_id: str, tokens: int) -> None:
        """A local request's prefill is queued on `engine` until its first token."""
        self.queued[engine.name] = self.queued.get(engine.name, 0) + tokens
        self._queued_by[request_id] = (engine.name, tokens)

    def unqueue(self, request_id: str) -> None:
        entry = self._queued_by.pop(request_id, None)
        if entry is not None:
            self.queued[entry[0]] -= entry[1]


def _feeder(index: EngineIndex) -> Callable[[KVEvent], None]:
    """The KV event sink that keeps `index` equal to what the engine's pool holds."""

    def feed(event: KVEvent) -> None:
        if event.kind == "cleared":
            for gmap in index.maps:
                gmap.clear()
            return
        gmap = index.maps[event.group]
        if event.kind == "stored":
            for key in event.keys:
                gmap[key] = 1
        else:
            for key in event.keys:
                gmap.pop(key, None)

    return feed
