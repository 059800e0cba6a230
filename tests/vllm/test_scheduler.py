"""The seam: `relaykv.vllm.Scheduler` is vLLM's scheduler, with relaykv's cache manager
under a relaykv policy and untouched under `legacy` (relaykv/vllm/scheduler.py, manager.py,
connector.py, events.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager
from vllm.v1.request import RequestStatus

from relaykv.kvcache.geometry import preset
from relaykv.vllm.manager import RelayKVCacheManager
from relaykv.vllm.probe import (
    EngineSpec,
    StandInWorker,
    _request,
    _run_to_end,
    build_scheduler,
)


def _engine(model_dirs, policy: str, role: str | None = None, **kw):
    spec = EngineSpec(preset("gpt-oss-like"), {"pd_policy": policy}, role, "E", 512, 4096, **kw)
    return build_scheduler(spec, model_dirs)


def test_legacy_keeps_vllm_s_own_cache_manager(model_dirs) -> None:
    s = _engine(model_dirs, "legacy", "kv_consumer")
    assert type(s.kv_cache_manager) is VllmKVCacheManager and s.relaykv is None
    assert s.connector.connector_scheduler.relay is None


@pytest.mark.parametrize("policy", ["replay-slack", "exact", "per-group"])
def test_a_relaykv_policy_puts_relaykv_behind_vllm_s_manager(model_dirs, policy) -> None:
    s = _engine(model_dirs, policy, "kv_consumer")
    assert isinstance(s.kv_cache_manager, RelayKVCacheManager)
    assert s.kv_cache_manager.relay.pd_policy.value == policy
    # The connector's scheduler half takes its block lists from the same manager.
    assert s.connector.connector_scheduler.relay is s.kv_cache_manager


def test_a_bad_policy_names_the_key(model_dirs) -> None:
    with pytest.raises(ValueError, match=r"kv_connector_extra_config\.pd_policy"):
        _engine(model_dirs, "magic", "kv_consumer")
    with pytest.raises(ValueError, match=r"additional_config\.relaykv\.pd_policy"):
        _engine(model_dirs, "magic")


def test_settings_the_manager_does_not_implement_are_refused(model_dirs) -> None:
    with pytest.raises(ValueError, match="--watermark"):
        _engine(model_dirs, "per-group", scheduler_options={"watermark": 0.01})
    # legacy is stock vLLM: everything vLLM supports
    assert _engine(model_dirs, "legacy", scheduler_options={"watermark": 0.01})
    # async scheduling (vLLM's default on a GPU) runs: frees wait for the in-flight step
    assert _engine(
        model_dirs, "per-group", "kv_consumer", scheduler_options={"async_scheduling": True}
    )


def test_kv_events_keep_vllm_s_format(model_dirs) -> None:
    s = _engine(model_dirs, "per-group", kv_events=True)
    batches = []
    s.kv_event_publisher.publish = batches.append
    worker = StandInWorker(s)
    prompt = list(range(1, 301))
    s.add_request(_request("a", prompt, None, 16))
    _run_to_end(worker, "a")
    events = [e for batch in batches for e in batch.events]
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert {e.group_idx for e in stored} == {0, 1}
    full = [e for e in stored if e.group_idx == 0]
    assert all(e.kv_cache_spec_kind == "full_attention" for e in full)
    sliding = [e for e in stored if e.group_idx == 1]
    assert all(e.kv_cache_spec_sliding_window == 128 for e in sliding)
    # The full group keys every full prompt block, with the tokens and the parent chain.
    assert sum(len(e.block_hashes) for e in full) == 300 // 16
    assert full[0].token_ids == prompt[: 16 * len(full[0].block_hashes)]
    assert full[0].parent_block_hash is None and full[0].block_size == 16
    s.kv_cache_manager.evict_blocks(
        {s.kv_cache_manager.relay.pool.maps[0][full[0].block_hashes[0]]}
    )
    assert s.reset_prefix_cache()
    events = s.kv_cache_manager.take_events()
    assert isinstance(events[0], BlockRemoved) and events[0].group_idx == 0
    assert isinstance(events[-1], AllBlocksCleared)


def test_the_hit_cap_of_vllm_s_scheduler_bounds_the_hit(model_dirs) -> None:
    # vLLM passes `max_cache_hit_length` (an aux-output connector's retained prefix) to
    # get_computed_blocks; relaykv's hit stays below it, aligned, and admit takes that hit.
    options = {"pd_policy": "per-group", "retention": "dense"}
    spec = EngineSpec(preset("gpt-oss-like"), options, None, "E", 512, 4096)
    s = build_scheduler(spec, model_dirs)
    worker = StandInWorker(s)
    prompt = list(range(1, 301))
    s.add_request(_request("a", prompt, None, 16))
    _run_to_end(worker, "a")
    again = _request("b", prompt, None, 16)
    manager = s.kv_cache_manager
    assert manager.get_computed_blocks(again)[1] == 272  # N-1, aligned, EAGLE drop
    blocks, tokens, _ = manager.get_computed_blocks(again, 100)
    assert tokens == 96 and len(blocks.blocks[0]) == 6
    new = manager.allocate_slots(again, 300 - 96, num_new_computed_tokens=96)
    assert new is not None
    assert manager.get_blocks("b").blocks[0][:6] == blocks.blocks[0]


def test_a_model_without_relaykv_rules_runs_stock_vllm(model_dirs, monkeypatch, caplog) -> None:
    import relaykv.vllm.scheduler as module

    def refuse(*args, **kwargs):
        raise module.UnsupportedKVCacheSpec("KV cache group 1 (MambaSpec) has no relaykv rule")

    monkeypatch.setattr(module, "geometry_from_kv_cache_config", refuse)
    with caplog.at_level("WARNING", logger="relaykv.vllm.scheduler"):
        s = _engine(model_dirs, "per-group", "kv_consumer")
    assert type(s.kv_cache_manager) is VllmKVCacheManager and s.relaykv is None
    assert "MambaSpec" in s.relaykv_fallback
    assert "stock vLLM's KV cache manager" in caplog.text
    assert s.connector.connector_scheduler.relay is None  # NIXL as shipped


def _load_from_a_stock_prefill_engine(model_dirs, policy: str):
    d = _engine(model_dirs, policy, "kv_consumer")
    worker = StandInWorker(d)
    prompt = list(range(1, 301))
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(range(1, 20)), list(range(20, 30))],
        "remote_engine_id": "P",
        "remote_request_id": "p-a",
        "remote_host": "localhost",
        "remote_port": 1234,
        "tp_size": 1,
    }
    d.add_request(_request("a", prompt, params, 16))
    worker.step()
    keyed = None
    if d.relaykv is not None:
        creq = d.relaykv.relay.requests["a"]
        assert creq.role.value == "colocated" and creq.load is None
        keyed = list(creq.num_cached_blocks)
    _run_to_end(worker, "a")
    again = d.kv_cache_manager.get_computed_blocks(_request("b", prompt, None, 16))[1]
    return worker.received["a"], keyed, again


def test_a_load_from_a_prefill_engine_without_the_plugin_is_stock_vllm_s(model_dirs) -> None:
    # No relaykv_pd_policy in the parameters: NIXL's own pairing fills the blocks relaykv
    # allocated for the external tokens, keyed once the load ends: what stock vLLM does.
    received, keyed, again = _load_from_a_stock_prefill_engine(model_dirs, "per-group")
    assert keyed == [0, 0]  # nothing keyed while the load flies
    assert (received, again) == _load_from_a_stock_prefill_engine(model_dirs, "legacy")[::2]
    assert received == [19, 9] and again == 0  # NIXL's window clip: no reuse (PR #56449)


@pytest.mark.parametrize("policy", ["legacy", "per-group"])
def test_a_preempted_request_s_blocks_wait_for_the_steps_in_flight(model_dirs, policy) -> None:
    # Async scheduling on a kv_consumer (vLLM defers frees there): the stand-in worker
    # launches the prefill and then the decode before either lands; a preemption meanwhile
    # (reset_prefix_cache(reset_running_requests=True), vLLM's path for it) must not
    # return blocks those steps still write. Stock vLLM and the plugin agree step by step.
    s = _engine(model_dirs, policy, "kv_consumer", scheduler_options={"async_scheduling": True})
    assert s.defer_block_free and type(s).__name__ == "AsyncScheduler"
    worker = StandInWorker(s)
    pool = s.kv_cache_manager.block_pool
    total = pool.get_num_free_blocks()
    s.add_request(_request("a", list(range(1, 301)), None, 16, max_tokens=4))
    prefill = worker.launch()
    decode = worker.launch()  # launched before the prefill lands: two steps in flight
    held = pool.get_num_free_blocks()
    assert held < total
    with pytest.raises(RuntimeError, match="Failed to reset KV cache"):
        s.reset_prefix_cache(reset_running_requests=True)  # the held blocks block a reset
    assert s.requests["a"].status.name == "PREEMPTED"
    assert pool.get_num_free_blocks() == held
    worker.land(*prefill)
    assert pool.get_num_free_blocks() == held  # the decode step still writes them
    worker.land(*decode)
    assert pool.get_num_free_blocks() == total
    if s.relaykv is not None:
        assert s.relaykv.relay.check() == []
    assert s.reset_prefix_cache()
    _run_to_end(worker, "a")
    assert pool.get_num_free_blocks() == total


def test_vllm_s_reservation_for_requests_in_flight_asks_relaykv(model_dirs) -> None:
    # vLLM reserves the blocks in-flight prefills still need before it starts an async load
    # (Scheduler._request_remaining_blocks); its own coordinator holds nothing here.
    s = _engine(model_dirs, "per-group")
    s.add_request(_request("a", list(range(1, 301)), None, 16, max_tokens=4))
    StandInWorker(s).step()
    remaining = s._request_remaining_blocks(s.requests["a"])
    relay = s.kv_cache_manager.relay
    fresh = relay.add_request("fresh", list(range(1, 301)))
    # What it holds counts: fewer than a request holding nothing needs.
    assert 0 < remaining < relay.blocks_to_fit(fresh, 304)
    # vLLM's per-group lists are views of relaykv's tables (relaykv/vllm/mirror.py): the
    # reservation added nothing to them.
    req_to_blocks = s.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
    assert list(req_to_blocks) == ["a"]
    assert [b.block_id for b in req_to_blocks["a"]] == relay.requests["a"].tables[0]


def _abort_during_the_load(model_dirs, policy: str, recv_done_first: bool) -> tuple[int, int, Any]:
    """P prefills a prompt for D; D admits it (its load handed to the worker), then the
    client aborts it: before the worker reports the transfer over (vLLM frees the blocks on
    that report), or after (the request is freed at once). Returns D's free blocks before
    and after, and D's scheduler."""
    p = StandInWorker(_engine(model_dirs, policy, "kv_producer"))
    d = StandInWorker(_engine(model_dirs, policy, "kv_consumer"))
    pool = d.scheduler.kv_cache_manager.block_pool
    total = pool.get_num_free_blocks()
    prompt = list(range(1, 1001))
    p.scheduler.add_request(_request("p", prompt, {"do_remote_decode": True}, 16))
    params = _run_to_end(p, "p")
    d.scheduler.add_request(_request("d", prompt, dict(params), 16))
    launched = d.launch()  # D admits it: its load goes to the worker
    assert pool.get_num_free_blocks() < total
    if recv_done_first:
        d.land(*launched)  # the transfer is over; the request waits to be resumed
        d.scheduler.finish_requests("d", RequestStatus.FINISHED_ABORTED)
    else:
        d.scheduler.finish_requests("d", RequestStatus.FINISHED_ABORTED)
        d.land(*launched)  # the transfer is over: vLLM frees the aborted request's blocks
    for _ in range(2):
        d.step()
    return total, pool.get_num_free_blocks(), d.scheduler


@pytest.mark.parametrize("recv_done_first", [False, True])
def test_a_request_aborted_during_its_load_gives_its_blocks_back(model_dirs, recv_done_first):
    # A client that aborts a P/D request while D loads its KV: stock vLLM returns every
    # block once the transfer is over; so must relaykv (the load was left pending for good,
    # its blocks held: a client could drain D's pool request by request).
    total, after, _ = _abort_during_the_load(model_dirs, "legacy", recv_done_first)
    assert after == total  # the reference: stock vLLM
    total, after, s = _abort_during_the_load(model_dirs, "per-group", recv_done_first)
    assert after == total
    relay = s.relaykv.relay
    assert not relay.requests and not relay.loads.active and relay.check() == []
    # nothing it received is keyed: the free blocks carry no hash vLLM's readers would ask
    view = s.kv_cache_manager.block_pool
    assert all(b.block_hash is None for b in view.free_block_queue.get_all_free_blocks())
