"""The engine's step log (engine/step_log.py): one record per executed step, on the clock
`relaykv bench` stamps requests with, naming what each step did for each sequence: a
colocated or local prompt is `prefill` (in chunks), a delivered P/D request's first step is
its `load`, and every later step `decode`."""

from __future__ import annotations

import itertools
import time

from relaykv.common.messages.steps import SequenceOutput
from relaykv.engine.step_log import STEP_LOG_ENTRIES, StepLog, StepWork, work_kind

from .conftest import drain, greedy, make_engine, prompt
from .test_local_prefill import _decode_scheduler
from .test_remote_slots import _request, _step


def test_every_step_is_recorded_with_its_chunks_and_decodes() -> None:
    engine = make_engine(budget=16)
    before = time.perf_counter()
    engine.add_request("a", prompt(37, seed=1), greedy(4))
    drain(engine)
    records = engine.steps.since()
    assert len(records) == engine.metrics.num_steps
    assert before <= records[0].start
    assert all(r.start <= r.end <= n.start for r, n in itertools.pairwise(records))
    work = [r.work for r in records]
    # 37 prompt tokens in chunks of the 16-token budget (the last one samples), then the
    # three other output tokens one step each
    assert work == [
        (StepWork("a", "prefill", 16, 0),),
        (StepWork("a", "prefill", 16, 0),),
        (StepWork("a", "prefill", 5, 0),),
        *[(StepWork("a", "decode", 1, 0),)] * 3,
    ]
    assert engine.steps.since(records[-1].end) == records[-1:]
    assert engine.steps.since(time.perf_counter()) == []


def test_a_decode_engine_tells_loads_local_prefill_and_decodes_apart() -> None:
    # The scheduler's own batches on a decode engine: a delivered load, then a local request
    # prefilled in chunks of 16 next to the loaded stream (test_local_prefill.py).
    sched, connector = _decode_scheduler(16)
    sched.add(_request("loaded", 40, 30, remote=True))
    _step(sched)
    connector.finish("loaded", True)
    sched.add(_request("local", 60, 2, remote=False))
    kinds: list[dict[str, str]] = []
    for _ in range(6):
        scheduled = sched.schedule()
        kinds.append({
            s.request.request_id: work_kind(
                s.work.start_position, s.request.num_prompt_tokens, s.request.is_remote_prefill
            )
            for s in scheduled
        })
        sched.update(scheduled, [
            SequenceOutput(s.request.request_id, [7] if s.work.sample else [])
            for s in scheduled
        ])
    assert kinds == [
        {"loaded": "load", "local": "prefill"},
        {"loaded": "decode", "local": "prefill"},
        {"loaded": "decode", "local": "prefill"},
        {"loaded": "decode", "local": "prefill"},
        {"loaded": "decode", "local": "decode"},  # its second and last token
        {"loaded": "decode"},
    ]


def test_the_log_keeps_the_last_steps_up_to_its_entries() -> None:
    log = StepLog(entries=3)
    for i in range(5):
        log.add(float(i), i + 0.5, [StepWork(f"r{i}", "decode", 1, 2)])
    assert [r.start for r in log.since()] == [2.0, 3.0, 4.0]
    assert [r.start for r in log.since(3.5)] == [3.0, 4.0]  # ended at or after 3.5
    assert log.since()[0].as_json() == {
        "start": 2.0,
        "end": 2.5,
        "work": [{"request_id": "r2", "kind": "decode", "tokens": 1, "draft_tokens": 2}],
    }
    # a batch of two entries pushes out two steps of one; a batch above the limit stays alone
    log.add(5.0, 5.5, [StepWork("a", "decode", 1, 0), StepWork("b", "load", 1, 0)])
    assert [r.start for r in log.since()] == [4.0, 5.0]
    log.add(6.0, 6.5, [StepWork(f"x{i}", "prefill", 8, 0) for i in range(4)])
    assert [r.start for r in log.since()] == [6.0]
    assert STEP_LOG_ENTRIES >= 8192 * 8
