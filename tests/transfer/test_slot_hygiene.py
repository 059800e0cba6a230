"""Slot hygiene on a decode engine (docs/pd.md, "Slot hygiene"; issue #10 item 9).

A load that waits for a hung prefill engine holds its blocks but not a running slot: with
`max_num_seqs=1`, a local request and a request from a healthy P both finish while the load
still waits; then the hung P resumes (its load completes) or dies (the request recomputes or
fails, per `--kv-load-failure`). Outputs equal the colocated reference, both pools end empty,
and every invariant holds after every step (`PDPair.step`). Nothing here depends on timing: the
hung load can only end when the test acts (its timeouts are far beyond the test's waits).
"""

from __future__ import annotations

import random

import pytest

from relaykv.engine import SamplingParams
from relaykv.kvcache import Geometry, GroupSpec
from relaykv.transfer.transport import KVSourceDescriptor
from tests.waiting import wait_until

from ..engine.reference_executor import reference_generate
from .frozen_peer import FrozenPeer
from .pd_pair import PDPair

GEO = Geometry((GroupSpec("full", 4, draft=True), GroupSpec("sliding", 4, window=12)))
HUNG_FOR_S = 25.0  # bounds a broken run; the hung load's own limits are 2x (and ZeroMQ drops
# a connection whose handshake has not finished after 30 s: the frozen phase must stay shorter)


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(101) for _ in range(n)]


def _through(pair: PDPair, peer: FrozenPeer, params: dict) -> dict:
    """`params` pointing at `peer` instead of P's own port (re-signed by P)."""
    source = {**params["source"], "port": peer.port}
    moved = {**params, "source": KVSourceDescriptor.from_dict(source).to_dict()}
    return pair.p.connector.signer.sign(moved, float(params["lease_seconds"]))


@pytest.mark.parametrize(
    "outcome, on_failure",
    [("resumes", "recompute"), ("dies", "recompute"), ("dies", "fail")],
)
def test_a_load_from_a_hung_prefill_engine_does_not_hold_a_running_slot(
    outcome: str, on_failure: str
) -> None:
    pair = PDPair(
        GEO, "per-group", "tcp", timeout_s=2 * HUNG_FOR_S, idle_timeout_s=2 * HUNG_FOR_S,
        lease_seconds=2 * HUNG_FOR_S if outcome == "resumes" else 2.0,
        max_num_seqs=1, kv_load_failure=on_failure,
    )
    assert pair.p.connector.server is not None
    peer = FrozenPeer(pair.p.connector.server.descriptor.port)
    outs: dict[str, list] = {}
    try:
        hung, local, healthy = _tokens(150, 1), _tokens(90, 2), _tokens(110, 3)
        pair.decode("hung", hung, _through(pair, peer, pair.prefill("hung", hung)), 5)
        wait_until(lambda: pair.step(outs) and "hung" in pair.d.scheduler.loading
                   and peer.connections > 0, what="the load from the hung P to start")
        free_while_loading = pair.d.manager.pool.num_free
        assert free_while_loading < pair.d.manager.pool.num_usable  # it holds its blocks

        pair.d.add_request("local", local, SamplingParams(max_tokens=6, temperature=0,
                                                          ignore_eos=True))
        pair.decode("healthy", healthy, pair.prefill("healthy", healthy), 6)
        wait_until(
            lambda: pair.step(outs) is not None and {"local", "healthy"} <= set(pair.finished),
            timeout=HUNG_FOR_S, what="the local and the healthy request to finish",
        )
        # ... while the hung one still waits for its KV, holding its blocks, not a slot
        assert "hung" in pair.d.scheduler.loading and "hung" not in pair.finished
        assert pair.d.scheduler.running == []
        assert outs["local"] == reference_generate(GEO, local, 6)
        assert outs["healthy"] == reference_generate(GEO, healthy, 6)

        if outcome == "resumes":
            peer.resume()
        else:
            peer.kill()
        pair.run(timeout_s=HUNG_FOR_S, outs=outs)
        final = pair.finished["hung"]
        if outcome == "resumes":
            assert pair.d.manager.stats.loads_failed == 0  # its KV came from P after all
        else:
            assert pair.d.manager.stats.loads_failed == 1
        if on_failure == "fail" and outcome == "dies":
            assert final.finish_reason == "error" and "KV transfer" in final.error
        else:
            assert final.finish_reason == "length"
            assert outs["hung"] == reference_generate(GEO, hung, 5)
        for eng in (pair.p, pair.d):
            assert eng.manager.pool.num_free == eng.manager.pool.num_usable, "blocks leaked"
            assert not eng.manager.requests
    finally:
        peer.close()
        pair.close()
