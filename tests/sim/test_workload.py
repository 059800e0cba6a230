"""The simulator's datasets and arrivals equal `relaykv bench serve`'s for the same flags."""

from __future__ import annotations

import pytest

from relaykv.bench.arrivals import arrival_offsets as bench_offsets
from relaykv.bench.datasets import (
    generated_shared_prefix_requests,
    prefix_repetition_requests,
    random_requests,
)
from relaykv.sim.workload import (
    WorkloadError,
    arrival_offsets,
    prefix_repetition_dataset,
    random_dataset,
    shared_prefix_dataset,
)


def _same(ours, theirs) -> None:
    assert [(r.prompt, r.output_len) for r in ours] == [
        (r.prompt_ids, r.output_len) for r in theirs
    ]


def test_datasets_equal_bench_serve() -> None:
    _same(
        random_dataset(7, 259, 40, 9, 0.3, 5, 3),
        random_requests(7, 259, input_len=40, output_len=9, range_ratio=0.3, prefix_len=5, seed=3),
    )
    _same(
        prefix_repetition_dataset(9, 259, 50, 6, 2, 4, 1, True),
        prefix_repetition_requests(
            9, 259, prefix_len=50, suffix_len=6, num_prefixes=2, output_len=4, seed=1
        ),
    )
    _same(
        shared_prefix_dataset(259, 3, 4, 30, 5, 7, 0.5, 42, True),
        generated_shared_prefix_requests(
            259,
            num_groups=3,
            prompts_per_group=4,
            system_prompt_len=30,
            question_len=5,
            output_len=7,
            range_ratio=0.5,
            seed=42,
        ),
    )


def test_arrivals_equal_bench_serve() -> None:
    assert arrival_offsets(20, 3.0, 0.5, 7) == bench_offsets(20, 3.0, 0.5, 7)
    assert arrival_offsets(4, float("inf"), 1.0, 0) == [0.0] * 4


def test_bad_flags_name_the_flag() -> None:
    with pytest.raises(WorkloadError, match="--prefix-repetition-num-prefixes"):
        prefix_repetition_dataset(3, 10, 5, 5, 0, 1, 0, True)
    with pytest.raises(WorkloadError, match="--request-rate"):
        arrival_offsets(3, 0.0, 1.0, 0)
