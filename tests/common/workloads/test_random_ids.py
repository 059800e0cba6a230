"""vLLM's random dataset, checked against its definition (docs/benchmarking.md "Datasets")."""

from __future__ import annotations

import itertools
import math

import pytest

from relaykv.common.workloads import DatasetError, allowed_ids, random_requests
from relaykv.common.workloads.random_ids import length_bounds


def test_fixed_lengths_without_range_ratio() -> None:
    reqs = random_requests(7, 1000, input_len=50, output_len=9)
    assert len(reqs) == 7
    assert all(r.prompt_len == 50 and r.output_len == 9 for r in reqs)
    assert all(0 <= t < 1000 for r in reqs for t in r.prompt_ids)


def test_lengths_stay_in_the_range_ratio_bounds() -> None:
    reqs = random_requests(400, 1000, input_len=100, output_len=10, range_ratio=0.5, seed=3)
    ins = [r.prompt_len for r in reqs]
    outs = [r.output_len for r in reqs]
    assert min(ins) >= 50 and max(ins) <= 150
    assert min(outs) >= 5 and max(outs) <= 15
    assert len(set(ins)) > 30  # really spread out, not pinned to one value


def test_bounds_use_floor_and_ceil_and_output_floor_of_one() -> None:
    assert length_bounds(10, 0.25) == (math.floor(7.5), math.ceil(12.5))
    assert length_bounds(1, 0.9, floor_one=True) == (1, 2)
    assert length_bounds(0, 0.0, floor_one=True) == (1, 1)


def test_shared_prefix_and_consecutive_own_ids() -> None:
    reqs = random_requests(5, 100, input_len=30, prefix_len=12, seed=1)
    prefix = reqs[0].prompt_ids[:12]
    for i, r in enumerate(reqs):
        assert r.prompt_len == 42
        assert r.prompt_ids[:12] == prefix
        own = r.prompt_ids[12:]
        # allowed[(offset + i + j) % V]: consecutive ids modulo the vocabulary
        assert all((b - a) % 100 == 1 for a, b in itertools.pairwise(own)), i


def test_special_ids_are_never_drawn() -> None:
    special = [0, 1, 2, 50]
    reqs = random_requests(20, 60, input_len=40, prefix_len=10, special_ids=special, seed=5)
    assert not {t for r in reqs for t in r.prompt_ids} & set(special)
    assert list(allowed_ids(6, [0, 5])) == [1, 2, 3, 4]


def test_seed_determinism() -> None:
    a = random_requests(4, 500, input_len=20, range_ratio=0.3, prefix_len=4, seed=11)
    b = random_requests(4, 500, input_len=20, range_ratio=0.3, prefix_len=4, seed=11)
    c = random_requests(4, 500, input_len=20, range_ratio=0.3, prefix_len=4, seed=12)
    assert [r.prompt_ids for r in a] == [r.prompt_ids for r in b]
    assert [r.prompt_ids for r in a] != [r.prompt_ids for r in c]


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"range_ratio": 1.0}, "--random-range-ratio"),
        ({"range_ratio": -0.1}, "--random-range-ratio"),
        ({"input_len": 0}, "--random-input-len"),
        ({"input_len": -1}, "--random-input-len"),
        ({"prefix_len": -2}, "--random-prefix-len"),
    ],
)
def test_bad_parameters_name_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(DatasetError, match=flag):
        random_requests(3, 100, **kwargs)


def test_zero_prompts_and_empty_vocab_are_errors() -> None:
    with pytest.raises(DatasetError, match="--num-prompts"):
        random_requests(0, 100)
    with pytest.raises(DatasetError, match="--vocab-size"):
        random_requests(2, 3, special_ids=[0, 1, 2])
