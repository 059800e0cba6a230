"""P/D flows: the upstream report's probe phases per policy, shared loads, failures, leases (§7)."""

from __future__ import annotations

import random
import time

import pytest

from relaykv.kvcache import Geometry, GroupSpec
from relaykv.transfer.transport import FaultPlan, KVSourceDescriptor

from ..engine.reference_executor import reference_generate
from ..waiting import wait_until
from .pd_pair import PDPair

# gpt-oss-like in miniature: draft in the full group, A = b = 4, W = 12.
GEO = Geometry((GroupSpec("full", 4, draft=True), GroupSpec("sliding", 4, window=12)))


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(101) for _ in range(n)]


def _phase(pair: PDPair, prompts: dict[str, list[int]], overlap: bool) -> dict[str, int]:
    """Send prompts through P then D (max_tokens=1), serially or all in flight at once;
    returns the deltas of D's counters."""
    before = pair.d.manager.stats.snapshot()
    if overlap:
        for rid, p in prompts.items():
            pair.decode(rid, p, pair.prefill(rid, p), 1)
        pair.run()
    else:
        for rid, p in prompts.items():
            pair.decode(rid, p, pair.prefill(rid, p), 1)
            pair.run()
    after = pair.d.manager.stats.snapshot()
    for rid in prompts:
        assert pair.finished[rid].num_output_tokens == 1
    return {
        k: after[k] - before[k]
        for k in (
            "prefix_cache_hits",
            "external_prefix_cache_hits",
            "kv_bytes_received",
            "loads_coalesced",
        )
    }


def _probe(policy: str) -> list[dict[str, int]]:
    pair = PDPair(GEO, policy, "tcp")
    try:
        x = _tokens(200, 1)
        a, b = _tokens(30, 2), _tokens(30, 3)
        xa, xb = x + a, x + b
        return [
            _phase(pair, {"first": xa}, overlap=False),
            _phase(pair, {"serial-a": xa, "serial-b": xb}, overlap=False),
            _phase(
                pair,
                {"overlap-a": x + _tokens(30, 4), "overlap-b": x + _tokens(30, 5)},
                overlap=True,
            ),
        ]
    finally:
        pair.close()


def test_probe_legacy_never_hits_locally() -> None:
    phases = _probe("legacy")
    assert [p["prefix_cache_hits"] for p in phases] == [0, 0, 0]
    assert all(p["external_prefix_cache_hits"] > 0 for p in phases)


def test_probe_exact_hits_the_resend_like_a_colocated_engine() -> None:
    first, serial, _ = _probe("exact")
    assert first["prefix_cache_hits"] == 0
    # x+a resent: the replay boundary of 230 tokens (A=4, draft peek): 224.
    assert serial["prefix_cache_hits"] == 224
    assert serial["kv_bytes_received"] < first["kv_bytes_received"] * 2


def test_probe_per_group_reuses_x_and_receives_only_delta_and_window() -> None:
    first, serial, overlap = _probe("per-group")
    # serial: x+a is all local but the tail; x+b reuses all of x in the full group.
    assert serial["prefix_cache_hits"] >= 224 + 196
    # overlap: siblings of x again reuse x; only their own suffix and window cross.
    assert overlap["prefix_cache_hits"] >= 2 * 196
    assert overlap["kv_bytes_received"] < first["kv_bytes_received"]


def test_concurrent_siblings_share_one_transfer() -> None:
    pair = PDPair(GEO, "per-group", "tcp")
    try:
        x = _tokens(300, 7)
        p1, p2 = x + _tokens(10, 8), x + _tokens(10, 9)
        params = [pair.prefill("s1", p1), pair.prefill("s2", p2)]
        pair.decode("s1", p1, params[0], 5)
        pair.decode("s2", p2, params[1], 5)
        outs = pair.run()
        assert pair.d.manager.stats.loads_coalesced == 1
        assert outs["s1"] == reference_generate(GEO, p1, 5)
        assert outs["s2"] == reference_generate(GEO, p2, 5)
    finally:
        pair.close()


FAULTS = {
    "corrupted": FaultPlan(corrupt_page=1),
    "short": FaultPlan(short=True),
    "dies_mid_transfer": FaultPlan(die_after_pages=2),
    "timeout": FaultPlan(delay_s=3.0),
    "dropped": FaultPlan(drop=True),
}


@pytest.mark.parametrize("failure", [*FAULTS, "unreachable"])
@pytest.mark.parametrize("on_failure", ["recompute", "fail"])
def test_failed_transfers_recompute_or_fail_and_leak_nothing(failure: str, on_failure: str) -> None:
    pair = PDPair(GEO, "per-group", "tcp", timeout_s=1.0, kv_load_failure=on_failure)
    try:
        prompt = _tokens(150, 11)
        if failure == "unreachable":
            pair.p.connector.lease_seconds = 0.5  # D cannot tell P: the lease frees P
        params = pair.prefill("f", prompt)
        if failure == "unreachable":
            source = dict(params["source"])
            source["port"] = 1  # nothing listens there (re-signed: P's grant names its port)
            params = {**params, "source": KVSourceDescriptor.from_dict(source).to_dict()}
            params = pair.p.connector.signer.sign(params, 30.0)
        else:
            pair.p.connector.server.inject(FAULTS[failure])
        pair.decode("f", prompt, params, 6)
        outs = pair.run(timeout_s=30)
        final = pair.finished["f"]
        if on_failure == "recompute":
            assert outs["f"] == reference_generate(GEO, prompt, 6)
            assert final.finish_reason == "length"
        else:
            assert final.finish_reason == "error" and "KV transfer" in final.error
        assert pair.d.manager.stats.loads_failed == 1
        for eng in (pair.p, pair.d):
            assert eng.manager.pool.num_free == eng.manager.pool.num_usable
    finally:
        pair.close()


def test_lease_expiry_frees_prefill_blocks() -> None:
    pair = PDPair(GEO, "per-group", "tcp", lease_seconds=0.3)
    try:
        pair.prefill("never-read", _tokens(100, 12))
        assert pair.p.manager.pool.num_free < pair.p.manager.pool.num_usable
        deadline = time.monotonic() + 5
        while pair.p.connector._held and time.monotonic() < deadline:
            pair.p.scheduler.settle_transfers()
            time.sleep(0.02)
        assert pair.p.manager.pool.num_free == pair.p.manager.pool.num_usable
        assert pair.p.manager.stats.lease_expiries == 1
    finally:
        pair.close()


def test_full_local_hit_releases_prefill_at_once() -> None:
    pair = PDPair(GEO, "per-group", "tcp", lease_seconds=60)
    try:
        prompt = _tokens(120, 13)
        pair.decode("one", prompt, pair.prefill("one", prompt), 2)
        pair.run()
        # A resend: D holds everything but what it recomputes; P must not wait 60 s.
        pair.decode("two", prompt, pair.prefill("two", prompt), 2)
        pair.run(timeout_s=10)
        assert pair.p.manager.stats.lease_expiries == 0
    finally:
        pair.close()


def test_bad_transfer_params_are_rejected() -> None:
    from relaykv.engine import InvalidRequest, SamplingParams

    pair = PDPair(GEO, "per-group", "tcp")
    try:
        prompt = _tokens(20, 14)
        params = pair.prefill("ok", prompt)
        for bad in (
            {"do_remote_prefill": True},
            {**params, "pd_policy": "legacy"},
            {**params, "remote_block_ids": [[]]},
            "nope",
        ):
            with pytest.raises(InvalidRequest):
                pair.d.add_request("bad", prompt, SamplingParams(), kv_transfer_params=bad)
        with pytest.raises(InvalidRequest):
            pair.p.add_request("x", prompt, SamplingParams(), kv_transfer_params=params)
        assert not pair.d.manager.requests
    finally:
        pair.close()


def test_queued_request_keeps_its_lease_alive() -> None:
    """D's pool has no room for a second request's KV while the first one runs, for three of
    P's leases: the second waits unadmitted and D's keep-alives, over the real transport,
    keep P's blocks until D can read them. The first request runs until then by the clock
    (then it is aborted), the engines stepping every 20 ms, so that its KV grows by about as
    many blocks on a fast machine as on a slow one."""
    lease = 0.6
    pair = PDPair(GEO, "per-group", "tcp", lease_seconds=lease, d_blocks=120)
    pair.d.scheduler.config = type(pair.d.scheduler.config)(
        max_num_batched_tokens=256, max_num_seqs=1, max_model_len=2048
    )
    try:
        first, second = _tokens(200, 20), _tokens(200, 21)
        pair.decode("busy", first, pair.prefill("busy", first), 1800)
        outs: dict[str, list] = {}
        pool = pair.d.manager.pool
        wait_until(lambda: pair.step(outs) and pool.num_free < 40, timeout=60,
                   interval=0, what="the first request to fill D's pool")
        pair.decode("queued", second, pair.prefill("queued", second), 4)
        started = time.monotonic()
        while time.monotonic() - started < 3 * lease:
            pair.step(outs)
            assert [r.request_id for r in pair.d.scheduler.waiting] == ["queued"]  # no room
            assert "queued" in pair.p.connector._held  # P still keeps its blocks
            time.sleep(0.02)
        assert pair.d.abort("busy")
        outs = pair.run(timeout_s=60, outs=outs)
        assert outs["queued"] == reference_generate(GEO, second, 4)
        assert pair.p.manager.stats.lease_expiries == 0
        assert pair.d.manager.stats.loads_failed == 0
    finally:
        pair.close()
