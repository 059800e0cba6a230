"""The scheduler's policies, one table row each: what every step schedules, step by step.

Each row drives `Scheduler` directly (no model: a sampled position yields token 7) and lists,
per step, the scheduled `(request, start position, tokens)`; a trailing `*` marks the entry
that samples. The rows pin chunked prefill, running-before-waiting order, the request cap,
the token budget, prefix hits, the admission gate and preemption by recompute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from relaykv.common.messages.steps import SamplingParams, SequenceOutput
from relaykv.engine.request import Request
from relaykv.engine.scheduler import Scheduler, SchedulerConfig
from relaykv.kvcache import Geometry, GroupSpec, KVCacheManager, assert_consistent

GEO = Geometry((GroupSpec("full", 4), GroupSpec("sliding", 4, window=8)))


@dataclass(frozen=True)
class Row:
    name: str
    requests: tuple[tuple[str, int, int], ...]  # (id, prompt length, max_tokens), in order
    steps: tuple[tuple[str, ...], ...]  # per step: "id:start+n" ("*" when it samples)
    budget: int = 64
    max_seqs: int = 8
    num_blocks: int = 200
    prompts: dict[str, list[int]] = field(default_factory=dict)  # explicit prompts by id
    preemptions: int = 0


def _prompt(row: Row, rid: str, n: int) -> list[int]:
    return row.prompts.get(rid, [sum(map(ord, rid)) * 10 + i % 7 for i in range(n)])


def run(row: Row) -> tuple[list[tuple[str, ...]], Scheduler]:
    manager = KVCacheManager(GEO, row.num_blocks, max_model_len=256, max_in_flight_tokens=64)
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=row.budget, max_num_seqs=row.max_seqs),
        manager,
    )
    for rid, n, max_tokens in row.requests:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        sched.add(Request(rid, _prompt(row, rid, n), params))
    seen: list[tuple[str, ...]] = []
    while sched.num_unfinished and len(seen) < 200:
        scheduled = sched.schedule()
        seen.append(
            tuple(
                f"{s.request.request_id}:{s.work.start_position}+{len(s.work.token_ids)}"
                + ("*" if s.work.sample else "")
                for s in scheduled
            )
        )
        outputs = [
            SequenceOutput(s.request.request_id, [7] if s.work.sample else []) for s in scheduled
        ]
        sched.update(scheduled, outputs)
        assert_consistent(manager)
        assert sched.check() == []
    assert manager.pool.num_free == manager.pool.num_usable, "blocks leaked"
    return seen, sched


ROWS = [
    Row(
        "chunked prefill: a long prompt is cut by the token budget",
        requests=(("a", 40, 2),),
        budget=16,
        steps=(("a:0+16",), ("a:16+16",), ("a:32+8*",), ("a:40+1*",)),
    ),
    Row(
        "running requests first, then waiting ones in arrival order, within the budget",
        requests=(("a", 10, 2), ("b", 10, 2)),
        budget=16,
        steps=(("a:0+10*", "b:0+6"), ("a:10+1*", "b:6+4*"), ("b:10+1*",)),
    ),
    Row(
        "max_num_seqs: the second request waits for a free seat",
        requests=(("a", 8, 2), ("b", 8, 1)),
        max_seqs=1,
        steps=(("a:0+8*",), ("a:8+1*",), ("b:0+8*",)),
    ),
    Row(
        "a prefix hit starts at the aligned hit, not at 0",
        requests=(("a", 21, 1), ("b", 21, 1)),
        max_seqs=1,
        prompts={"a": list(range(21)), "b": list(range(21))},
        steps=(("a:0+21*",), ("b:20+1*",)),
    ),
    Row(
        "admission gate: a request whose prompt cannot fit under the caps waits",
        requests=(("a", 30, 12), ("b", 30, 1)),
        num_blocks=20,
        steps=(
            ("a:0+30*",),
            ("a:30+1*",),
            ("a:31+1*",),
            ("a:32+1*",),
            ("a:33+1*",),
            ("a:34+1*",),
            ("a:35+1*",),
            ("a:36+1*",),
            ("a:37+1*",),
            ("a:38+1*",),
            ("a:39+1*",),
            ("a:40+1*",),
            ("b:0+30*",),
        ),
    ),
    Row(
        "preemption by recompute: the newest running request yields its blocks (here evicted "
        "before it returns) and is recomputed with its sampled token once a finishes",
        requests=(("a", 12, 6), ("b", 12, 6)),
        num_blocks=14,
        steps=(
            ("a:0+12*", "b:0+12*"),
            ("a:12+1*",),  # b could not grow: preempted
            ("a:13+1*",),
            ("a:14+1*",),
            ("a:15+1*",),
            ("a:16+1*",),
            ("b:0+13*",),
            ("b:13+1*",),
            ("b:14+1*",),
            ("b:15+1*",),
            ("b:16+1*",),
        ),
        preemptions=1,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_scheduler_steps(row: Row) -> None:
    steps, sched = run(row)
    assert tuple(steps) == row.steps
    assert sched.num_preemptions == row.preemptions
