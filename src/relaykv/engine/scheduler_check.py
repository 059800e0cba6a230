"""The scheduler's invariants, checked by tests after every step (`Scheduler.check`).

Every live request is in exactly one queue with that queue's state and a cache record:
`waiting` (WAITING), `running` (RUNNING), `loading` (WAITING_FOR_REMOTE_KV, its load not yet
delivered) or `ready` (WAITING, its load delivered, its blocks held). Only `running` counts
against `max_num_seqs`; `loading` only against `max_num_loads`, if set (docs/pd.md, "Slot
hygiene").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from relaykv.engine.request import Request, RequestState
from relaykv.kvcache import CacheLifecycle

_STATES = {
    "waiting": RequestState.WAITING,
    "running": RequestState.RUNNING,
    "loading": RequestState.WAITING_FOR_REMOTE_KV,
    "ready": RequestState.WAITING,
    "tier_loading": RequestState.WAITING_FOR_REMOTE_KV,
}


def scheduler_problems(
    queues: Mapping[str, Iterable[Request]],
    manager: CacheLifecycle,
    max_num_seqs: int,
    max_num_loads: int | None,
) -> list[str]:
    """`queues`: the scheduler's queues by name (waiting, running, loading, ready)."""
    problems = []
    seen: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for name, reqs in queues.items():
        sizes[name] = 0
        for req in reqs:
            sizes[name] += 1
            rid = req.request_id
            if rid in seen:
                problems.append(f"{rid} is in {seen[rid]} and {name}")
            seen[rid] = name
            if req.state is not _STATES[name]:
                problems.append(f"{rid} in {name} has state {req.state.value}")
            cache = req.cache
            if cache is None or cache.request_id not in manager.requests:
                problems.append(f"{rid} in {name} has no cache record")
            elif name == "running" and req.num_computed_tokens > req.num_tokens:
                problems.append(f"{rid} computed past its tokens")
            elif name == "loading" and cache.load is None:
                problems.append(f"{rid} is loading without a load")
            elif name == "ready" and (cache.load is not None or not any(cache.tables)):
                problems.append(f"{rid} is ready without its delivered blocks")
    if sizes["running"] > max_num_seqs:
        problems.append("more requests running than max_num_seqs")
    if max_num_loads is not None and sizes["loading"] > max_num_loads:
        problems.append("more loads from prefill engines than max_num_loads")
    return problems
