"""The decode side of the scheduler on its own: loads hold blocks, not running slots.

A stub connector stands in for the transport (a load ends when the test says so), so each
check is exact: with `max_num_seqs=1` a loading request never keeps a local one out; a
delivered load waits in `ready` with its blocks until the slot frees; when the pool runs
short the running request yields (preemption by recompute) and everything still finishes; a
delivered request preempted later is recomputed locally, never loaded again; an abort in any
queue returns every block (docs/pd.md, "Slot hygiene").
"""

from __future__ import annotations

from typing import Any

from relaykv.common.messages.steps import SamplingParams, SequenceOutput
from relaykv.engine.request import FinishReason, Request
from relaykv.engine.scheduler import Scheduler, SchedulerConfig
from relaykv.kvcache import Geometry, GroupSpec, KVCacheManager, KVLoad, assert_consistent

GEO = Geometry((GroupSpec("full", 4), GroupSpec("sliding", 4, window=8)))


class StubConnector:
    """Loads end only when `finish(request_id, ok)` is called."""

    def __init__(self) -> None:
        self.loads: dict[str, KVLoad] = {}
        self.ended: list[tuple[KVLoad, bool]] = []
        self.released: list[str] = []

    def validate(self, params: Any, prompt_ids: Any, cache_salt: Any = None) -> None:
        pass

    def prefill_finished(self, request: Request) -> None:
        return None

    def start_load(self, request: Request, load: KVLoad) -> None:
        self.loads[request.request_id] = load

    def release_remote(self, request: Request) -> None:
        self.released.append(request.request_id)

    def keep_alive(self, waiting: list[Request]) -> None:
        pass

    def finish(self, request_id: str, ok: bool) -> None:
        self.ended.append((self.loads.pop(request_id), ok))

    def poll(self) -> list[tuple[KVLoad, bool]]:
        done, self.ended = self.ended, []
        return done

    def shutdown(self) -> None:
        pass


def _setup(num_blocks: int = 200) -> tuple[Scheduler, StubConnector]:
    manager = KVCacheManager(GEO, num_blocks, max_model_len=256, max_in_flight_tokens=64,
                             pd_role=True)
    connector = StubConnector()
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1)
    return Scheduler(config, manager, connector=connector), connector


def _request(rid: str, n: int, max_tokens: int, remote: bool) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    kv = {"do_remote_prefill": True} if remote else None
    return Request(rid, [(len(rid) * 31 + i) % 97 for i in range(n)], params,
                   kv_transfer_params=kv)


def _step(sched: Scheduler) -> list[str]:
    scheduled = sched.schedule()
    outputs = [SequenceOutput(s.request.request_id, [7] if s.work.sample else [])
               for s in scheduled]
    sched.update(scheduled, outputs)
    assert_consistent(sched.manager)
    assert sched.check() == []
    return [s.request.request_id for s in scheduled]


def test_a_load_never_keeps_a_local_request_out_and_waits_for_the_slot_when_delivered() -> None:
    sched, connector = _setup()
    sched.add(_request("remote", 30, 3, remote=True))
    sched.add(_request("local", 20, 4, remote=False))
    assert _step(sched) == ["local"]  # the load started and did not take the only slot
    assert set(sched.loading) == {"remote"} and sched.loading["remote"].cache.tables[0]
    connector.finish("remote", ok=True)
    assert _step(sched) == ["local"]
    assert [r.request_id for r in sched.ready] == ["remote"]  # KV here, waiting for the slot
    while "local" in {r.request_id for r in sched.running}:
        _step(sched)
    assert _step(sched) == ["remote"]  # resumes at N-1: one token
    assert sched.running[0].num_computed_tokens == 30
    while sched.num_unfinished:
        _step(sched)
    assert sched.manager.pool.num_free == sched.manager.pool.num_usable


def test_a_short_pool_preempts_and_everything_still_finishes() -> None:
    # 14 blocks: the delivered load's blocks leave the running request too few to grow, so
    # it yields them (recompute); the delivered request runs, then the other resumes.
    sched, connector = _setup(num_blocks=15)
    sched.add(_request("local", 12, 12, remote=False))
    assert _step(sched) == ["local"]
    sched.add(_request("remote", 14, 6, remote=True))
    _step(sched)
    connector.finish("remote", ok=True)
    order = []
    for _ in range(100):
        if not sched.num_unfinished:
            break
        order += [rid for rid in _step(sched) if not order or order[-1] != rid]
    assert not sched.num_unfinished
    assert order == ["local", "remote", "local"] and sched.num_preemptions == 1
    assert sched.manager.pool.num_free == sched.manager.pool.num_usable


def test_a_delivered_request_preempted_later_is_recomputed_here_not_loaded_again() -> None:
    # Two slots, 15 usable blocks: the request that arrived with remote KV is the newest
    # running one when the pool runs short, so it yields; P's grant is gone by then, so it
    # comes back through a local lookup (its published prefix) rather than a second load.
    manager = KVCacheManager(GEO, 16, max_model_len=256, max_in_flight_tokens=64, pd_role=True)
    connector = StubConnector()
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2)
    sched = Scheduler(config, manager, connector=connector)
    sched.add(_request("local", 12, 12, remote=False))
    _step(sched)
    remote = _request("remote", 14, 8, remote=True)
    sched.add(remote)
    _step(sched)
    started = list(connector.loads)
    connector.finish("remote", ok=True)
    preempted_at = None
    for step in range(100):
        if not sched.num_unfinished:
            break
        _step(sched)
        if preempted_at is None and remote.num_preemptions:
            preempted_at = step
    assert started == ["remote"] and preempted_at is not None
    assert not connector.loads  # no second load was started
    assert remote.output_ids == [7] * 8 and remote.finish_reason is FinishReason.LENGTH
    assert manager.pool.num_free == manager.pool.num_usable


def test_aborts_in_every_queue_return_every_block() -> None:
    sched, connector = _setup()
    sched.add(_request("running", 10, 50, remote=False))
    sched.add(_request("loading", 30, 5, remote=True))
    sched.add(_request("ready", 26, 5, remote=True))
    _step(sched)
    connector.finish("ready", ok=True)
    _step(sched)
    assert set(sched.loading) == {"loading"} and [r.request_id for r in sched.ready] == ["ready"]
    for rid in ("ready", "loading", "running"):
        req = sched.abort(rid)
        assert req is not None and req.finish_reason is FinishReason.ABORT
        assert sched.check() == []
    # the aborted load's blocks stay with its transfer until the transport ends it
    connector.finish("loading", ok=False)
    _step(sched)
    assert sched.num_unfinished == 0
    assert sched.manager.pool.num_free == sched.manager.pool.num_usable
    assert not sched.manager.requests
