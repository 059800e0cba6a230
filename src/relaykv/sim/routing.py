"""The simulated router's engine choice: `relaykv router`'s own policies and index.

Per role, a `relaykv.router.backends.BackendPool` holds the engines and their in-flight
counts (the router's bookkeeping) and a `relaykv.router.policy` policy chooses among the
candidates: `cache-aware` (the router's default: usable hit vs load vs KV usage),
`least-loaded` or `round-robin` (`--routing`). Each engine's `EngineIndex` is the router's
own, fed by the engine's KV events (the cache manager's event sink) with no delay, and
scored as the router does: the index's cheap `hit_bound`, then its exact `usable_hit`
(kvcache's lookup, per role and P/D policy) only where the bound can win. The
engine's queue and KV usage are read at the moment of the decision (the real router sees
them at its last health tick: simulator.md "What is not modelled").
"""

from __future__ import annotations

from collections.abc import Callable

from relaykv.kvcache import KVEvent
from relaykv.router.backends import Backend, BackendPool
from relaykv.router.index import EngineIndex
from relaykv.router.policy import ROUTING_MODES, CacheAwarePolicy, Candidate, make_policy
from relaykv.router.routing import Prompt
from relaykv.sim.engine import SimEngine

__all__ = ["ROUTING_MODES", "SimRouter"]


class SimRouter:
    def __init__(self, mode: str, pools: dict[str, list[SimEngine]]) -> None:
        self.mode = mode
        self.engines = {e.name: e for engines in pools.values() for e in engines}
        self.pools = {role: BackendPool(role, [e.name for e in es]) for role, es in pools.items()}
        self.policies = {role: make_policy(mode) for role in pools}
        self.indexes: dict[str, EngineIndex] = {}
        if mode == "cache-aware":
            for engine in self.engines.values():
                index = EngineIndex(engine.manager.geometry, engine.role, engine.manager.pd_policy)
                engine.manager.set_event_sink(_feeder(index))
                self.indexes[engine.name] = index
        self.backends: dict[str, Backend] = {
            b.url: b for pool in self.pools.values() for b in pool.backends
        }

    def pick(self, role: str, tokens: list[int]) -> SimEngine:
        """The engine of `role` the router sends this prompt to (counted in flight).

        As `relaykv.router.routing.Routing.pick`: candidates carry the index's cheap hit
        bound, and the cache-aware policy asks for kvcache's exact lookup only where a
        bound can win (`choose_lazy`)."""
        backends = self.pools[role].backends
        # One engine: every policy picks it, so skip scoring (the hashing and lookups).
        prompt = Prompt(tokens) if self.indexes and len(backends) > 1 else None
        indexes = [self.indexes.get(b.url) if prompt else None for b in backends]
        candidates = []
        for b, index in zip(backends, indexes, strict=True):
            engine = self.engines[b.url]
            bound = index.hit_bound(prompt.request_for(index)) if prompt and index else 0
            candidates.append(
                Candidate(
                    hit_tokens=bound,
                    prompt_tokens=len(tokens),
                    in_flight=b.in_flight,
                    waiting=len(engine.scheduler.waiting),
                    kv_usage=engine.manager.pool.usage(),
                    cached_blocks=index.num_blocks if index is not None else 0,
                )
            )

        def exact_hit(i: int) -> int:
            index = indexes[i]
            assert prompt is not None and index is not None
            return index.usable_hit(prompt.request_for(index))

        policy = self.policies[role]
        if isinstance(policy, CacheAwarePolicy) and prompt is not None:
            choice = policy.choose_lazy(candidates, exact_hit)
        else:
            choice = policy.choose(candidates)
        backend = backends[choice]
        backend.in_flight += 1
        backend.requests += 1
        return self.engines[backend.url]

    def done(self, engine: SimEngine) -> None:
        self.backends[engine.name].in_flight -= 1


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
