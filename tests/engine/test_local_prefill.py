"""A decode engine's own prefill (conditional disaggregation, docs/routing.md): requests sent
without KV are computed in chunks of at most `max_local_prefill_tokens` per step while the
delivered loads keep decoding every step, and the counters say how much was computed here."""

from __future__ import annotations

from relaykv.common.messages.steps import SequenceOutput
from relaykv.engine.scheduler import Scheduler, SchedulerConfig
from relaykv.kvcache import KVCacheManager

from .test_remote_slots import GEO, StubConnector, _request, _step


def _decode_scheduler(cap: int | None) -> tuple[Scheduler, StubConnector]:
    manager = KVCacheManager(GEO, 200, max_model_len=256, max_in_flight_tokens=64, pd_role=True)
    connector = StubConnector()
    config = SchedulerConfig(
        max_num_batched_tokens=64, max_num_seqs=4, max_local_prefill_tokens=cap
    )
    return Scheduler(config, manager, connector=connector), connector


def _chunks(cap: int | None) -> tuple[list[int], Scheduler]:
    """Per step, the prompt tokens the local request computed, while a loaded request decodes."""
    sched, connector = _decode_scheduler(cap)
    sched.add(_request("loaded", 40, 30, remote=True))
    _step(sched)  # its load starts
    connector.finish("loaded", True)
    _step(sched)  # delivered: resumes at N-1 and samples
    sched.add(_request("local", 60, 2, remote=False))
    chunks: list[int] = []
    while True:
        scheduled = sched.schedule()
        ids = {s.request.request_id: s for s in scheduled}
        assert "loaded" in ids  # the running stream gets a token every step
        local = ids.get("local")
        if local is not None and local.work.start_position < 60:
            start = local.work.start_position
            chunks.append(min(60, start + len(local.work.token_ids)) - start)
        sched.update(scheduled, [
            SequenceOutput(s.request.request_id, [7] if s.work.sample else [])
            for s in scheduled
        ])
        assert sched.check() == []
        if sum(chunks) >= 60:
            return chunks, sched


def test_local_prefill_is_chunked_under_the_cap_and_counted() -> None:
    chunks, sched = _chunks(16)
    assert chunks == [16, 16, 16, 12]
    assert sched.metrics.local_requests == 1
    assert sched.metrics.local_prefill_tokens == 60


def test_without_a_cap_the_prompt_takes_the_step_budget() -> None:
    chunks, sched = _chunks(None)
    assert chunks == [60]
    assert sched.metrics.local_requests == 0  # not a decode engine's local prefill


def test_a_local_request_over_the_cap_does_not_hold_back_a_load() -> None:
    sched, connector = _decode_scheduler(16)
    sched.add(_request("local", 60, 2, remote=False))
    sched.add(_request("other", 30, 2, remote=False))
    sched.add(_request("remote", 40, 2, remote=True))
    assert _step(sched) == ["local"]  # the cap is spent on the first local request
    assert "remote" in connector.loads  # but the load behind both started
    assert [r.request_id for r in sched.waiting] == ["other"]


def test_a_decode_engine_refuses_a_local_request_its_pool_cannot_take_now() -> None:
    from relaykv.kvcache import Role

    from .conftest import greedy, make_engine, prompt

    decode = make_engine(num_blocks=120, role=Role.DECODE)
    small, big = prompt(40, 1), prompt(200, 2)
    assert decode.refuses_locally(small, greedy(8)) is None
    # A P/D request is a load (admitted by the pool when it can), never refused here.
    assert decode.refuses_locally(big, greedy(200), {"do_remote_prefill": True}) is None
    # Fill the pool with a running local request: the next one must go through P.
    decode.add_request("a", prompt(300, 3), greedy(150))
    decode.step()
    refused = decode.refuses_locally(big, greedy(200))
    assert refused is not None and "send it through a prefill engine" in refused
    # Colocated and prefill engines take every request (their queue waits for blocks).
    assert make_engine(num_blocks=40).refuses_locally(big, greedy(200)) is None


def test_a_request_sampling_its_last_token_gets_no_proposal() -> None:
    """With a draft (k = 2), the step that samples a request's last token proposes nothing
    (the request ends; a c1/output1 sibling's one step on D is then no longer than P's
    prefill step), while a request that goes on proposes as before."""
    manager = KVCacheManager(GEO, 200, max_model_len=256, max_in_flight_tokens=64, pd_role=True)
    config = SchedulerConfig(max_num_batched_tokens=128, max_num_seqs=4)
    sched = Scheduler(config, manager, num_speculative_tokens=2, connector=StubConnector())
    sched.add(_request("one", 40, 1, remote=False))
    sched.add(_request("three", 40, 3, remote=False))
    proposes: dict[str, list[bool]] = {"one": [], "three": []}
    while sched.running or sched.waiting:
        scheduled = sched.schedule()
        for s in scheduled:
            if s.work.sample:
                proposes[s.request.request_id].append(s.work.propose)
        sched.update(scheduled, [
            SequenceOutput(s.request.request_id, [7] if s.work.sample else [])
            for s in scheduled
        ])
        assert sched.check() == []
    # "three": proposes after its first and second tokens, not with its third.
    assert proposes == {"one": [False], "three": [True, True, False]}
