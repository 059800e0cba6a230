"""vLLM's cache structures under the plugin are live views of relaykv's (relaykv/vllm/mirror.py):
per-group block lists, cached-block counts, the free queue, cached blocks by vLLM's block
hashes, and each block's reference count and hash."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.request import RequestStatus

from relaykv.kvcache.geometry import Geometry, GroupSpec, preset
from relaykv.vllm.probe import EngineSpec, StandInWorker, _request, build_scheduler
from relaykv.vllm.scheduler import unsupported_settings

FULL = Geometry((GroupSpec("full", 16),))
PROMPTS = [
    list(range(1, 301)),
    [*range(1, 161), *[7] * 30],  # shares 10 blocks with the first
    list(range(500, 700)),
    list(range(1, 301)),  # the first again: a hit
]


def _engine(model_dirs, geometry: Geometry, stock: bool, num_blocks: int = 256) -> StandInWorker:
    options = {"pd_policy": "legacy" if stock else "per-group", "retention": "dense"}
    spec = EngineSpec(geometry, options, None, "C", num_blocks, 2048, stock)
    return StandInWorker(build_scheduler(spec, model_dirs))


def _observed(s: Any) -> dict[str, Any]:
    """What vLLM's own structures say, read only through vLLM's attributes."""
    manager = s.kv_cache_manager
    pool = manager.block_pool
    out: dict[str, Any] = {
        "free": pool.get_num_free_blocks(),
        "queue": pool.free_block_queue.num_free_blocks,
        "queue_len": len(pool.free_block_queue.get_all_free_blocks()),
        "held": sum(1 for b in pool.blocks if b.ref_cnt > 0),
        "cached": {b.block_hash for b in pool.blocks if b.block_hash is not None},
    }
    for g, single in enumerate(manager.coordinator.single_type_managers):
        out[f"blocks{g}"] = {rid: len(blocks) for rid, blocks in single.req_to_blocks.items()}
        out[f"num_cached{g}"] = dict(single.num_cached_block)
    return out


def test_under_full_attention_vllm_s_structures_read_as_stock_vllm_s(model_dirs) -> None:
    # One full-attention group, one request at a time: relaykv and vLLM decide alike, so
    # what vLLM's structures say under the plugin equals what they say in stock vLLM, step
    # by step (block ids may differ; counts, hashes and cached sets may not).
    stock, plugin = _engine(model_dirs, FULL, True), _engine(model_dirs, FULL, False)
    for i, prompt in enumerate(PROMPTS):
        for w in (stock, plugin):
            w.scheduler.add_request(_request(f"r{i}", prompt, None, 16, max_tokens=20))
        for _ in range(22):
            stock.step()
            plugin.step()
            assert _observed(plugin.scheduler) == _observed(stock.scheduler)
    # Every cached vLLM hash finds its block through vLLM's pool calls.
    pool = plugin.scheduler.kv_cache_manager.block_pool
    cached = [b for b in pool.blocks if b.block_hash is not None]
    assert len(cached) == len(pool.cached_block_hash_to_block) > 0
    for block in cached:
        assert pool.get_cached_block(block.block_hash[:-4], [0]) == [block]
        assert pool.cached_block_hash_to_block.get_one_block(block.block_hash) is block


def _check_views(s: Any) -> int:
    """The views against relaykv's tables and vLLM's own request hashes; returns the number
    of keyed blocks checked by name."""
    manager = s.kv_cache_manager
    relay, pool = manager.relay, manager.block_pool
    singles = manager.coordinator.single_type_managers
    hash_size = pool.hash_block_size
    refs: Counter[int] = Counter()
    named = 0
    for rid, creq in relay.requests.items():
        request = s.requests.get(rid)
        for g, single in enumerate(singles):
            blocks = single.req_to_blocks[rid]
            assert [b.block_id for b in blocks] == creq.tables[g]
            assert all((b.block_id == 0) == (b is single._null_block) for b in blocks)
            if not any(creq.tables):
                assert rid not in single.req_to_blocks
                continue
            assert single.num_cached_block[rid] == creq.num_cached_blocks[g]
            refs.update(b.block_id for b in blocks if b.block_id)
            if request is None:
                continue
            scale = relay.rules[g].block_size // hash_size
            keys = creq.keys(g)
            for k, block in enumerate(blocks):
                own = k < len(keys) and relay.pool.block_key[block.block_id] == keys[k]
                if block.block_id and own:
                    # vLLM's hash of the same block of the same request, with its group.
                    vllm_hash = request.block_hashes[(k + 1) * scale - 1]
                    assert block.block_hash == make_block_hash_with_group_id(vllm_hash, g)
                    assert pool.get_cached_block(vllm_hash, [g]) == [block]
                    named += 1
    # Reference counts are the tables' (no detached blocks here), the queue the idle blocks.
    assert {b.block_id: b.ref_cnt for b in pool.blocks if b.ref_cnt} == dict(refs)
    idle = {b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0}
    assert {b.block_id for b in pool.free_block_queue.get_all_free_blocks()} == idle
    assert pool.get_num_free_blocks() == len(idle)
    keyed = sum(1 for b in pool.blocks if b.block_hash is not None)
    assert keyed == len(pool.cached_block_hash_to_block) == sum(map(len, relay.pool.maps))
    return named


@pytest.mark.parametrize("name", ["gpt-oss-like", "dsv4-like"])
def test_the_views_name_relaykv_s_blocks_with_vllm_s_hashes(model_dirs, name) -> None:
    # Hybrid geometries (sliding windows, an EAGLE draft group, block sizes 4 to 256 over
    # a hash unit of 4 or 16): every keyed block of a live request carries vLLM's hash of
    # that block, the lists show relaykv's tables with vLLM's null block, the counts add up.
    geometry = preset(name)
    w = _engine(model_dirs, geometry, False, num_blocks=2048)
    s = w.scheduler
    u = geometry.hash_unit
    named = 0
    for i, prompt in enumerate(PROMPTS[:2]):
        s.add_request(_request(f"r{i}", [*prompt, *prompt, *prompt], None, u, max_tokens=40))
    for _ in range(60):
        w.step()
        named += _check_views(s)
        if not s.requests:
            break
    assert named > 0
    assert not s.requests and _check_views(s) == 0


def test_names_stay_bounded(model_dirs) -> None:
    # Pairs of keys no longer cached are dropped: many distinct prompts through a small pool.
    w = _engine(model_dirs, FULL, False, num_blocks=40)
    s = w.scheduler
    names = s.kv_cache_manager.names
    for i in range(30):
        s.add_request(_request(f"r{i}", list(range(1000 * i, 1000 * i + 200)), None, 16))
        for _ in range(3):
            w.step()
        # Named: 12 blocks a request, 360 in all; kept: at most twice the cached and live
        # ones (< 40 + 12) plus one request's.
        assert len(names.of_key[0]) <= 3 * 40
        assert len(names.of_hash[0]) == len(names.of_key[0])
    _check_views(s)


def test_the_views_are_read_only(model_dirs) -> None:
    s = _engine(model_dirs, FULL, False).scheduler
    pool = s.kv_cache_manager.block_pool
    with pytest.raises(RuntimeError, match="read-only"):
        pool.free_block_queue.popleft()
    with pytest.raises(RuntimeError, match="read-only"):
        pool.get_new_blocks(1)
    with pytest.raises(RuntimeError, match="read-only"):
        pool.blocks[1].ref_cnt = 3
    assert pool.blocks[1].ref_cnt == 0


def test_the_aux_output_connector_sees_relaykv_s_cache(model_dirs) -> None:
    # vLLM's auxiliary-output connector keeps a finished request's outputs for the blocks
    # the pool still caches (asked by vLLM's block hashes), and releases those of evicted
    # blocks once past its capacity (the pool's size).
    w = _engine(model_dirs, FULL, False, num_blocks=5)
    s = w.scheduler
    aux = AuxOutputSchedulerConnector(s.kv_cache_manager)
    s.aux_output_connector = aux
    first, second = (_request(f"r{i}", [*range(100 * i, 100 * i + 64)], None, 16) for i in (1, 2))
    for request in (first, second):
        s.add_request(request)
        s.schedule()
        s.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
    # The second's 4 blocks are retained (cached when it finished); the first's were evicted
    # by the second: past the capacity (8 > 5) the 3 oldest are released.
    assert aux._retained_hashes == second.block_hashes
    assert aux._released_hashes == first.block_hashes[:3]


def test_aux_outputs_are_refused_only_where_relaykv_s_reuse_is_uncapped() -> None:
    class Config:
        def __init__(self, connector: str | None, role: str | None) -> None:
            self.parallel_config = type("P", (), {"decode_context_parallel_size": 1})()
            self.scheduler_config = type("S", (), {"watermark": 0.0})()
            self.num_hash_lookahead_tokens = 0
            self.aux_output_config = type("A", (), {"enabled": True})()
            self.kv_transfer_config = (
                type("T", (), {"kv_connector": connector, "kv_role": role})() if connector else None
            )

    assert unsupported_settings(Config(None, None)) == []
    assert unsupported_settings(Config("RelayKVConnector", "kv_producer")) == []
    assert unsupported_settings(Config("OffloadingConnector", "kv_both")) == []
    for role in ("kv_consumer", "kv_both"):
        assert unsupported_settings(Config("RelayKVConnector", role)) == [
            "auxiliary outputs on a decode engine of RelayKVConnector"
        ]
