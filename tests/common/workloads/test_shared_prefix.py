"""SGLang's generated-shared-prefix dataset, checked against docs/benchmarking.md."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from relaykv.common.workloads import DatasetError, generated_shared_prefix_requests
from relaykv.common.workloads.shared_prefix import sglang_random_lens


def test_total_is_groups_times_prompts_and_lengths_are_exact_by_default() -> None:
    reqs = generated_shared_prefix_requests(
        1000,
        num_groups=3,
        prompts_per_group=5,
        system_prompt_len=40,
        question_len=6,
        output_len=11,
    )
    assert len(reqs) == 15
    assert all(r.prompt_len == 46 and r.output_len == 11 for r in reqs)
    systems = Counter(tuple(r.prompt_ids[:40]) for r in reqs)
    assert sorted(systems.values()) == [5, 5, 5]
    assert len({tuple(r.prompt_ids[40:]) for r in reqs}) == 15


def test_defaults_match_compat() -> None:
    reqs = generated_shared_prefix_requests(32000)
    assert len(reqs) == 64 * 16
    assert {r.prompt_len for r in reqs} == {2048 + 128}
    assert {r.output_len for r in reqs} == {256}
    again = generated_shared_prefix_requests(32000, seed=42)  # default seed is 42
    assert [r.prompt_ids for r in reqs[:5]] == [r.prompt_ids for r in again[:5]]


def test_ordered_is_group_major() -> None:
    reqs = generated_shared_prefix_requests(
        500,
        num_groups=4,
        prompts_per_group=3,
        system_prompt_len=8,
        question_len=2,
        shuffle=False,
    )
    systems = [tuple(r.prompt_ids[:8]) for r in reqs]
    assert [systems.index(s) for s in systems] == [i // 3 * 3 for i in range(12)]
    shuffled = generated_shared_prefix_requests(
        500, num_groups=4, prompts_per_group=3, system_prompt_len=8, question_len=2
    )
    assert sorted(r.prompt_ids for r in shuffled) == sorted(r.prompt_ids for r in reqs)


def test_range_ratio_draws_lengths_in_sglang_bounds() -> None:
    reqs = generated_shared_prefix_requests(
        500,
        num_groups=20,
        prompts_per_group=10,
        system_prompt_len=30,
        question_len=10,
        output_len=8,
        range_ratio=0.5,
    )
    outs = [r.output_len for r in reqs]
    assert min(outs) >= 4 and max(outs) <= 8 and len(set(outs)) > 1
    lens = sglang_random_lens(np.random.RandomState(0), 10, 0.0, 500)
    assert min(lens) >= 1 and max(lens) <= 10  # floor of 1 when int(L*r) = 0
    assert sglang_random_lens(np.random.RandomState(0), 0, 1.0, 3) == [0, 0, 0]


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"num_groups": 0}, "--gsp-num-groups"),
        ({"prompts_per_group": 0}, "--gsp-prompts-per-group"),
        ({"range_ratio": 1.5}, "--gsp-range-ratio"),
        ({"system_prompt_len": 0, "question_len": 0}, "--gsp-system-prompt-len"),
    ],
)
def test_bad_parameters(kwargs: dict, flag: str) -> None:
    with pytest.raises(DatasetError, match=flag):
        generated_shared_prefix_requests(100, **kwargs)
