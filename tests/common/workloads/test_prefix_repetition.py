"""vLLM's prefix_repetition dataset, checked against its definition (docs/benchmarking.md)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from relaykv.common.workloads import DatasetError, prefix_repetition_requests


def _split(reqs, prefix_len):
    return [tuple(r.prompt_ids[:prefix_len]) for r in reqs], [
        tuple(r.prompt_ids[prefix_len:]) for r in reqs
    ]


def test_request_count_is_num_prefixes_times_floor() -> None:
    reqs = prefix_repetition_requests(10, 1000, prefix_len=8, suffix_len=4, num_prefixes=3)
    assert len(reqs) == 3 * (10 // 3) == 9


def test_fewer_prompts_than_prefixes_is_an_error_naming_both_flags() -> None:
    with pytest.raises(DatasetError, match=r"--num-prompts.*--prefix-repetition-num-prefixes"):
        prefix_repetition_requests(4, 1000, num_prefixes=5)


def test_lengths_sharing_and_output_len() -> None:
    reqs = prefix_repetition_requests(
        12, 5000, prefix_len=32, suffix_len=8, num_prefixes=3, output_len=7
    )
    assert all(r.prompt_len == 40 and r.output_len == 7 for r in reqs)
    prefixes, suffixes = _split(reqs, 32)
    assert sorted(Counter(prefixes).values()) == [4, 4, 4]  # 3 prefixes x 4 prompts
    assert len(set(suffixes)) == 12  # every suffix drawn afresh


def test_defaults_match_compat() -> None:
    reqs = prefix_repetition_requests(20, 32000)
    assert len(reqs) == 20  # 10 prefixes x 2
    assert all(r.prompt_len == 512 and r.output_len == 128 for r in reqs)
    prefixes, _ = _split(reqs, 256)
    assert len(set(prefixes)) == 10


def test_ids_equal_vllms_seeded_global_draws() -> None:
    """vLLM: np.random.seed(seed); randint per prefix then per suffix; random.shuffle."""
    state_np, state_py = np.random.get_state(), random.getstate()
    try:
        np.random.seed(7)
        random.seed(7)
        expected = []
        for _ in range(2):
            prefix = np.random.randint(0, 300, size=5).tolist()
            for _ in range(3):
                expected.append(prefix + np.random.randint(0, 300, size=4).tolist())
        random.shuffle(expected)
    finally:
        np.random.set_state(state_np)
        random.setstate(state_py)
    reqs = prefix_repetition_requests(6, 300, prefix_len=5, suffix_len=4, num_prefixes=2, seed=7)
    assert [r.prompt_ids for r in reqs] == expected


def test_disable_shuffle_keeps_generation_order() -> None:
    ordered = prefix_repetition_requests(
        40, 1000, prefix_len=6, suffix_len=3, num_prefixes=4, shuffle=False
    )
    prefixes, _ = _split(ordered, 6)
    assert [prefixes.index(p) for p in prefixes] == [i // 10 * 10 for i in range(40)]
    shuffled = prefix_repetition_requests(40, 1000, prefix_len=6, suffix_len=3, num_prefixes=4)
    assert sorted(r.prompt_ids for r in shuffled) == sorted(r.prompt_ids for r in ordered)
    assert [r.prompt_ids for r in shuffled] != [r.prompt_ids for r in ordered]


def test_seed_changes_the_tokens() -> None:
    a = prefix_repetition_requests(2, 1000, prefix_len=16, suffix_len=4, num_prefixes=1, seed=0)
    b = prefix_repetition_requests(2, 1000, prefix_len=16, suffix_len=4, num_prefixes=1, seed=1)
    assert a[0].prompt_ids[:16] != b[0].prompt_ids[:16]


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"prefix_len": -1}, "--prefix-repetition-prefix-len"),
        ({"suffix_len": -1}, "--prefix-repetition-suffix-len"),
        ({"num_prefixes": 0}, "--prefix-repetition-num-prefixes"),
        ({"prefix_len": 0, "suffix_len": 0}, "prefix-len"),
    ],
)
def test_bad_parameters(kwargs: dict, flag: str) -> None:
    with pytest.raises(DatasetError, match=flag):
        prefix_repetition_requests(10, 100, **kwargs)
