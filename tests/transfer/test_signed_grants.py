"""Signed grants (docs/security.md): D refuses transfer parameters that P of this cluster did
not issue for exactly this prompt, before allocating or reading anything."""

from __future__ import annotations

import random

import pytest

from relaykv.engine import InvalidRequest, LLMEngine, SamplingParams
from relaykv.kvcache import Geometry, GroupSpec, assert_consistent
from relaykv.transfer.connector import PDConnector
from relaykv.transfer.grant import GrantSigner
from relaykv.transfer.transport import get_transport
from tests.waiting import wait_until

from ..engine.reference_executor import reference_generate
from .pd_pair import PDPair, engine

GEO = Geometry((GroupSpec("full", 4, draft=True), GroupSpec("sliding", 4, window=12)))


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(101) for _ in range(n)]


@pytest.fixture
def pair():
    pd = PDPair(GEO, "per-group", "tcp", lease_seconds=2.0)
    yield pd
    pd.close()


def _refused(pair: PDPair, prompt: list[int], params: dict, match: str, salt=None) -> None:
    free = pair.d.manager.pool.num_free
    received = pair.d.manager.stats.snapshot()
    with pytest.raises(InvalidRequest, match=match) as info:
        pair.d.add_request(
            "victim", prompt, SamplingParams(max_tokens=4, temperature=0),
            kv_transfer_params=params, cache_salt=salt,
        )
    assert info.value.field == "kv_transfer_params"
    assert "victim" not in pair.d.requests
    assert pair.d.manager.pool.num_free == free  # nothing allocated
    assert pair.d.manager.stats.snapshot() == received  # nothing received or cached


def test_params_for_another_prompt_are_refused_and_outputs_stay_right(pair: PDPair) -> None:
    """Issue #10 item 2: a grant for prompt A handed to D with prompt B (same length) would
    publish A's KV under B's hashes. D recomputes B's hashes and refuses."""
    a, b = _tokens(150, 1), _tokens(150, 2)
    params_a = pair.prefill("a", a)
    _refused(pair, b, params_a, "different prompt")
    # the same prompt with another cache salt is another prompt too
    _refused(pair, a, params_a, "different prompt", salt="tenant-2")
    # B through the proper path is unaffected: its output is the colocated reference
    pair.decode("b", b, pair.prefill("b", b), 6)
    outs = pair.run(timeout_s=30)
    assert outs["b"] == reference_generate(GEO, b, 6)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda p: {**p, "grant_signature": "0" * 64}, "not signed"),
        (lambda p: {k: v for k, v in p.items() if k != "grant_signature"}, "not signed"),
        (lambda p: {**p, "remote_block_ids": [[[0, 1]], []]}, "not signed"),
        (lambda p: {**p, "block_hashes": [[], []]}, "not signed"),
        (lambda p: {**p, "expires_at": p["expires_at"] + 3600}, "not signed"),
        (lambda p: GrantSigner(b"another cluster" * 3).sign(p, 30), "not signed"),
    ],
    ids=["bad-signature", "unsigned", "other-blocks", "other-hashes", "later-expiry", "other-key"],
)
def test_forged_or_altered_params_are_refused(pair: PDPair, edit, match: str) -> None:
    prompt = _tokens(120, 3)
    _refused(pair, prompt, edit(pair.prefill("x", prompt)), match)


def test_expired_and_misdirected_params_are_refused(pair: PDPair) -> None:
    prompt = _tokens(90, 4)
    params = pair.prefill("x", prompt)
    signer = pair.p.connector.signer
    _refused(pair, prompt, signer.sign(params, -1.0), "expired")
    _refused(pair, prompt, signer.sign({**params, "destination_engine_id": "D-other"}, 30),
             "issued for engine 'D-other'")
    short = prompt[:-1]
    _refused(pair, short, params, "120|90-token prompt")


def test_a_grant_for_one_decode_engine_is_refused_by_another() -> None:
    """The router names D in its request to P; P binds the signed grant to D. Another D
    refuses it (400, nothing allocated); one that skips its own check is refused by P's
    transfer server, recomputes, and cannot end the grant: the right D still reads it."""
    pair = PDPair(GEO, "per-group", "tcp", lease_seconds=30.0)
    other = engine(GEO, "decode", "per-group", 600)
    other.attach_connector(PDConnector(
        "decode", other.manager, get_transport("tcp"), other.executor.buffer,
        engine_id="D-other", quarantine_seconds=0.2,
    ))
    try:
        prompt = _tokens(140, 5)
        params = pair.prefill("x", prompt, destination=pair.d.connector.engine_id)
        assert params["destination_engine_id"] == pair.d.connector.engine_id
        free = other.manager.pool.num_free
        with pytest.raises(InvalidRequest, match="issued for engine") as info:
            other.add_request("x", prompt, SamplingParams(max_tokens=4, temperature=0),
                              kv_transfer_params=params)
        assert info.value.field == "kv_transfer_params" and other.manager.pool.num_free == free

        other.connector.validate = lambda *args: None  # a D that skips its own check
        other.add_request("x", prompt, SamplingParams(max_tokens=4, temperature=0,
                                                      ignore_eos=True), kv_transfer_params=params)
        outs: list[int] = []
        wait_until(lambda: _step_alone(other, pair, outs), what="the other D to finish")
        assert outs == reference_generate(GEO, prompt, 4)  # recomputed from its own prompt
        assert other.manager.stats.loads_failed == 1
        assert pair.p.connector.server.stats()["refused"] == 1
        assert other.manager.pool.num_free == other.manager.pool.num_usable

        # its release did not end the grant: the engine it names still reads it
        pair.decode("x", prompt, params, 4)
        assert pair.run(timeout_s=30)["x"] == reference_generate(GEO, prompt, 4)
        assert pair.d.manager.stats.loads_failed == 0
        assert pair.p.manager.stats.lease_expiries == 0
    finally:
        other.connector.shutdown()
        pair.close()


def _step_alone(d: LLMEngine, pair: PDPair, outs: list[int]) -> bool:
    for out in d.step():
        outs.extend(out.new_token_ids)
    pair.p.scheduler.settle_transfers()
    assert_consistent(d.manager)
    assert d.scheduler.check() == [] and d.connector.check() == []
    return not d.has_unfinished()
