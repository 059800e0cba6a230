"""Simulated clusters: invariants hold, runs are deterministic, the policies behave as the
upstream report (vLLM PR #56449) found, at a small scale (gpt-oss geometry, prefix_repetition)."""

from __future__ import annotations

from relaykv.common.workloads import arrival_offsets, prefix_repetition_requests
from relaykv.engine import SchedulerConfig
from relaykv.sim.cluster import ClusterSpec, SimCluster
from relaykv.sim.hardware import HARDWARE, LINKS
from relaykv.sim.model_presets import model_spec
from relaykv.sim.results import summarize

MODEL = model_spec("gpt-oss-20b")


def _run(policy: str, n: int = 12, concurrency: int = 4, num_decode: int = 1, **kw: object) -> dict:
    spec = ClusterSpec(
        MODEL,
        HARDWARE["h20"],
        LINKS["tcp-25g"],
        pd_policy=policy,
        prefill_tp=2,
        decode_tp=2,
        num_decode=num_decode,
        num_speculative_tokens=3,
        num_blocks=4000,
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_model_len=4096),
        **kw,  # type: ignore[arg-type]
    )
    reqs = prefix_repetition_requests(
        n, MODEL.vocab_size, prefix_len=2000, suffix_len=32, num_prefixes=1, output_len=16
    )
    cluster = SimCluster(spec)
    before: dict = {}
    start = cluster.run(
        reqs,
        arrival_offsets(n, float("inf"), 1.0, 0),
        max_concurrency=concurrency,
        num_warmups=1,
        on_measured=lambda: before.update(cluster.counters()),
    )
    assert cluster.check() == []
    for engine in cluster.engines.values():
        pool = engine.manager.pool
        assert pool.num_free == pool.num_usable  # nothing leaked, P released every lease
    return summarize(policy, cluster.records, start, before, cluster.counters(), 0.0)


def test_policies_on_prefix_repetition() -> None:
    legacy, slack, per_group = _run("legacy"), _run("replay-slack"), _run("per-group")
    for r in (legacy, slack, per_group):
        assert r["completed"] == 12 and r["failed"] == 0
        assert r["total_output_tokens"] == 12 * 16
    # As in the upstream report: with the draft in the full group, D's local hits stay at 0
    # under both.
    assert legacy["d_local_hit_tokens"] == 0 and slack["d_local_hit_tokens"] == 0
    assert per_group["d_local_hit_share"] >= 0.9
    assert per_group["d_kv_bytes_received"] * 10 <= legacy["d_kv_bytes_received"]
    # Over 25 Gb/s TCP the bytes are the time: fewer bytes, earlier first tokens.
    assert per_group["mean_ttft_ms"] < legacy["mean_ttft_ms"]


def test_runs_are_deterministic() -> None:
    a, b = _run("exact", n=8, num_decode=2), _run("exact", n=8, num_decode=2)
    assert a["ttfts_ms"] == b["ttfts_ms"] and a["d_kv_bytes_received"] == b["d_kv_bytes_received"]


def test_cache_aware_routing_keeps_siblings_together() -> None:
    from relaykv.common.workloads import generated_shared_prefix_requests

    reqs = generated_shared_prefix_requests(
        MODEL.vocab_size,
        num_groups=4,
        prompts_per_group=6,
        system_prompt_len=3000,
        question_len=32,
        output_len=8,
    )
    shares = {}
    for mode in ("cache-aware", "round-robin"):
        spec = ClusterSpec(
            MODEL,
            HARDWARE["h20"],
            LINKS["rdma"],
            pd_policy="per-group",
            num_decode=2,
            num_speculative_tokens=3,
            num_blocks=8000,
            routing=mode,
            scheduler=SchedulerConfig(max_num_batched_tokens=4096, max_model_len=4096),
        )
        cluster = SimCluster(spec)
        cluster.run(reqs, [0.0] * len(reqs), max_concurrency=2, num_warmups=0)
        assert cluster.check() == []
        decode = cluster.counters()["decode"]
        shares[mode] = decode["prefix_cache_hits"] / decode["prefix_cache_queries"]
    # The router's index sees D's received prefixes: siblings follow them.
    assert shares["cache-aware"] > shares["round-robin"] + 0.1, shares


def test_conditional_disaggregation_runs_the_routers_rule() -> None:
    """The router's rule on the simulated cluster: with a max suffix the siblings' suffixes
    fit (32 new tokens + the EAGLE unit), D prefills them itself; nothing is received for
    them and their first tokens come sooner (no P trip); greedy work is the same. A D that
    decodes the router's other streams gets siblings through P (`max_running`)."""
    always = _run("per-group")
    local = _run(
        "per-group",
        disaggregation="conditional",
        conditional_max_suffix=128,
        conditional_max_running=4,
        conditional_max_queued_prefill=4096,
    )
    # The warmup is P -> D (nothing on D yet); every measured sibling finds the prefix on D.
    assert local["local_requests"] == 12 and always["local_requests"] == 0
    assert local["total_output_tokens"] == always["total_output_tokens"] == 12 * 16
    assert local["d_kv_bytes_received"] == 0 < always["d_kv_bytes_received"]
    assert local["mean_ttft_ms"] < always["mean_ttft_ms"]
    # A suffix above the max: P -> D as before; only the resend of the warmup's prompt (the
    # first request) leaves just the EAGLE unit (16 tokens) to compute.
    short = _run(
        "per-group",
        disaggregation="conditional",
        conditional_max_suffix=16,
        conditional_max_running=4,
    )
    assert short["local_requests"] == 1
    # The router's default max running (0): at concurrency 4 D decodes the other streams
    # when a sibling arrives, so most siblings go P -> D; sequential siblings (c1) all go
    # local.
    busy = _run("per-group", disaggregation="conditional", conditional_max_suffix=128)
    assert busy["local_requests"] < 12
    alone = _run(
        "per-group", concurrency=1, disaggregation="conditional", conditional_max_suffix=128
    )
    assert alone["local_requests"] == 12


def test_the_cost_estimate_grows_with_the_p_trip() -> None:
    from relaykv.sim.cost_model import estimated_max_suffix

    hw = HARDWARE["h20"]
    low = estimated_max_suffix(MODEL, hw, 2, 0.004, 4096)
    high = estimated_max_suffix(MODEL, hw, 2, 0.04, 4096)
    assert 0 < low < high and low % 16 == 0
    assert estimated_max_suffix(MODEL, hw, 2, 0.0, 4096) == 0
    spec = ClusterSpec(
        MODEL,
        hw,
        LINKS["rdma"],
        decode_tp=2,
        disaggregation="conditional",
        scheduler=SchedulerConfig(max_model_len=4096),
    )
    assert spec.trip_seconds() == 2 * hw.request_overhead_s + 2 * hw.step_overhead_s + 1e-3
    rule = spec.conditional_rule()
    assert rule.max_suffix == estimated_max_suffix(MODEL, hw, 2, spec.trip_seconds(), 4096)


def test_a_shared_host_slows_overlapping_steps_only() -> None:
    """A CPU calibration's `shared_host_slowdown` (relaykv.sim.shared_host): every engine's
    steps share one host. The same requests, tokens and cache decisions; at concurrency 1
    (P and D never compute at once here) the same times; at concurrency 4 longer ones."""
    from dataclasses import replace

    shared = replace(HARDWARE["h20"], shared_host_slowdown=1.5)

    def run(hardware, concurrency: int) -> dict:
        spec = ClusterSpec(
            MODEL,
            hardware,
            LINKS["tcp-25g"],
            prefill_tp=2,
            decode_tp=2,
            num_blocks=4000,
            scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_model_len=4096),
        )
        reqs = prefix_repetition_requests(
            8, MODEL.vocab_size, prefix_len=2000, suffix_len=32, num_prefixes=2, output_len=16
        )
        cluster = SimCluster(spec)
        assert (cluster.host is not None) == (hardware.shared_host_slowdown > 1)
        offsets = arrival_offsets(8, float("inf"), 1.0, 0)
        start = cluster.run(reqs, offsets, max_concurrency=concurrency, num_warmups=0)
        assert cluster.check() == []
        return summarize("per-group", cluster.records, start, {}, cluster.counters(), 0.0)

    for concurrency in (1, 4):
        plain, slowed = run(HARDWARE["h20"], concurrency), run(shared, concurrency)
        same = ("completed", "total_output_tokens", "d_local_hit_tokens", "d_kv_bytes_received")
        assert {k: plain[k] for k in same} == {k: slowed[k] for k in same}
        if concurrency == 1:
            assert slowed["mean_ttft_ms"] == plain["mean_ttft_ms"]
            assert slowed["duration"] == plain["duration"]
        else:
            assert slowed["duration"] > plain["duration"] * 1.05
