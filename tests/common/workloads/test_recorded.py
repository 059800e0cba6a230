"""Same seeds, same prompts: the workloads on the floor give, digest for digest, what
`bench serve`'s datasets and the simulator's copy gave before they became one (recorded on
main before the move, both copies agreeing)."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from relaykv.common.workloads import (
    SampleRequest,
    arrival_offsets,
    generated_shared_prefix_requests,
    prefix_repetition_requests,
    random_requests,
)


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


def _requests(requests: list[SampleRequest]) -> str:
    return _digest([[r.prompt_ids, r.output_len] for r in requests])


RANDOM = [
    (
        dict(
            num_requests=8,
            vocab_size=1000,
            input_len=64,
            output_len=16,
            range_ratio=0.5,
            prefix_len=10,
            seed=0,
        ),
        "378a8f34479fa02c",
    ),
    (
        dict(
            num_requests=5,
            vocab_size=50,
            input_len=20,
            output_len=4,
            range_ratio=0.0,
            prefix_len=0,
            seed=7,
        ),
        "58b5ebe758666449",
    ),
    (
        dict(
            num_requests=6,
            vocab_size=300,
            input_len=40,
            output_len=3,
            range_ratio=0.25,
            prefix_len=5,
            seed=11,
        ),
        "634d6f06b9cf7767",
    ),
    (
        dict(
            num_requests=8,
            vocab_size=1000,
            input_len=64,
            output_len=16,
            range_ratio=0.5,
            prefix_len=10,
            seed=0,
            special_ids=[0, 1, 2, 500],
        ),
        "66beed83c6bdb9cd",
    ),
]
PREFIX_REPETITION = [
    (
        dict(
            num_requests=20,
            vocab_size=500,
            prefix_len=32,
            suffix_len=16,
            num_prefixes=4,
            output_len=8,
            seed=0,
            shuffle=True,
        ),
        "da059c31599f1923",
    ),
    (
        dict(
            num_requests=9,
            vocab_size=77,
            prefix_len=0,
            suffix_len=12,
            num_prefixes=3,
            output_len=2,
            seed=3,
            shuffle=False,
        ),
        "c17cb24200153c44",
    ),
]
SHARED_PREFIX = [
    (
        dict(
            vocab_size=1000,
            num_groups=3,
            prompts_per_group=4,
            system_prompt_len=64,
            question_len=16,
            output_len=8,
            range_ratio=0.5,
            seed=42,
            shuffle=True,
        ),
        "437175e0b6df448b",
    ),
    (
        dict(
            vocab_size=200,
            num_groups=2,
            prompts_per_group=3,
            system_prompt_len=20,
            question_len=0,
            output_len=5,
            range_ratio=1.0,
            seed=1,
            shuffle=False,
        ),
        "3e3e0506c08a4f4e",
    ),
]
ARRIVALS = [
    ((10, 4.0, 1.0, 0), "2624824c35f547d5"),
    ((12, 2.5, 0.5, 3), "cc3d08450cdc6009"),
    ((5, 3.0, math.inf, 0), "29c21db290e41a64"),
    ((4, math.inf, 1.0, 0), "b9214157569bc11b"),
]


@pytest.mark.parametrize(("params", "digest"), RANDOM)
def test_random_prompts_are_the_recorded_ones(params: dict, digest: str) -> None:
    assert _requests(random_requests(**params)) == digest


@pytest.mark.parametrize(("params", "digest"), PREFIX_REPETITION)
def test_prefix_repetition_prompts_are_the_recorded_ones(params: dict, digest: str) -> None:
    assert _requests(prefix_repetition_requests(**params)) == digest


@pytest.mark.parametrize(("params", "digest"), SHARED_PREFIX)
def test_shared_prefix_prompts_are_the_recorded_ones(params: dict, digest: str) -> None:
    assert _requests(generated_shared_prefix_requests(**params)) == digest


@pytest.mark.parametrize(("args", "digest"), ARRIVALS)
def test_arrivals_are_the_recorded_ones(args: tuple, digest: str) -> None:
    assert _digest(arrival_offsets(*args)) == digest
