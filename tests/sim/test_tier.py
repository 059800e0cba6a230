"""The simulated KV tier (docs/simulator.md "KV tier"): a colocated engine whose pool holds
two of six 2k-token prefixes revisits them; with a tier its hits come back (counted as
external, vLLM's way) and first tokens come earlier; invariants hold, nothing leaks, and a
slower host link costs time."""

from __future__ import annotations

from relaykv.common.workloads import arrival_offsets, prefix_repetition_requests
from relaykv.engine import SchedulerConfig
from relaykv.sim.cluster import ClusterSpec, SimCluster
from relaykv.sim.hardware import HARDWARE, LINKS
from relaykv.sim.model_presets import model_spec
from relaykv.sim.results import summarize

MODEL = model_spec("gpt-oss-20b")


def _run(tier_bytes: int | None, bandwidth: float = 32e9) -> tuple[dict, SimCluster]:
    spec = ClusterSpec(
        MODEL,
        HARDWARE["h100"],
        LINKS["rdma"],
        num_prefill=0,
        num_decode=1,
        num_blocks=300,
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_model_len=4096),
        kv_offloading_size=tier_bytes,
        kv_offloading_bandwidth=bandwidth,
    )
    reqs = prefix_repetition_requests(
        24, MODEL.vocab_size, prefix_len=2000, suffix_len=32, num_prefixes=6, output_len=16
    )
    cluster = SimCluster(spec)
    before: dict = {}
    start = cluster.run(
        reqs,
        arrival_offsets(24, float("inf"), 1.0, 0),
        max_concurrency=1,
        num_warmups=0,
        on_measured=lambda: before.update(cluster.counters()),
    )
    assert cluster.check() == []
    for engine in cluster.engines.values():
        pool = engine.manager.pool
        assert pool.num_free == pool.num_usable  # stores let their blocks go
    return summarize("per-group", cluster.records, start, before, cluster.counters(), 0.0), cluster


def test_a_tier_brings_revisits_back() -> None:
    without, _ = _run(None)
    with_tier, cluster = _run(8 << 30)
    assert without["completed"] == with_tier["completed"] == 24
    manager = next(iter(cluster.engines.values())).manager
    stats = manager.stats
    assert stats.external_prefix_cache_hits > 10 * 2000  # most revisits came from the tier
    assert manager.tier is not None and manager.tier.stats.blocks_loaded > 0
    assert with_tier["mean_ttft_ms"] < without["mean_ttft_ms"]
    slow, _ = _run(8 << 30, bandwidth=1e8)  # 0.1 GB/s: loading costs more than computing
    assert slow["mean_ttft_ms"] > with_tier["mean_ttft_ms"]
