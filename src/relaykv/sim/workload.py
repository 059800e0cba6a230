"""Request streams with `relaykv bench serve`'s dataset and load flags (docs/simulator.md).

The three synthetic datasets are generated on token ids with the definitions and seeds
docs/benchmarking.md gives (vLLM `random` and `prefix_repetition`, SGLang
`generated-shared-prefix`),
so for the same flags and vocabulary size the prompts are the ones `bench serve` sends as
ids. The simulator may not import `relaykv.bench` (bench is a wire client, docs/architecture.md),
hence this second implementation; `tests/sim/test_workload.py` checks the two agree.
Arrivals: rate inf = all at t=0, else gamma gaps (shape = burstiness) rescaled so the last
request is sent at N / rate, as vLLM does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

DATASETS = ("random", "prefix_repetition", "generated-shared-prefix")


@dataclass(frozen=True, slots=True)
class SimRequest:
    prompt: list[int]
    output_len: int


class WorkloadError(ValueError):
    """Bad dataset flags; the message names the flag."""


def _positive(value: float, flag: str) -> None:
    if not value > 0:
        raise WorkloadError(f"{flag} must be > 0, got {value}")


def random_dataset(
    n: int, vocab: int, input_len: int, output_len: int, ratio: float, prefix_len: int, seed: int
) -> list[SimRequest]:
    if not 0.0 <= ratio < 1.0:
        raise WorkloadError(f"--random-range-ratio must be in [0, 1), got {ratio}")
    lo, hi = math.floor(input_len * (1 - ratio)), math.ceil(input_len * (1 + ratio))
    olo = max(1, math.floor(output_len * (1 - ratio)))
    ohi = max(1, math.ceil(output_len * (1 + ratio)))
    if prefix_len + lo < 1:
        raise WorkloadError("--random-input-len is too small: every prompt needs a token")
    allowed = np.arange(vocab, dtype=np.int64)
    rng = np.random.default_rng(seed)
    ins = rng.integers(lo, hi + 1, size=n)
    outs = rng.integers(olo, ohi + 1, size=n)
    offsets = rng.integers(0, vocab, size=n)
    prefix = allowed[rng.integers(0, vocab, size=prefix_len)].tolist() if prefix_len else []
    return [
        SimRequest(
            prefix + allowed[(int(offsets[i]) + i + np.arange(int(ins[i]))) % vocab].tolist(),
            int(outs[i]),
        )
        for i in range(n)
    ]


def prefix_repetition_dataset(
    n: int,
    vocab: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: int,
    seed: int,
    shuffle: bool,
) -> list[SimRequest]:
    _positive(num_prefixes, "--prefix-repetition-num-prefixes")
    per = n // num_prefixes
    if per == 0:
        raise WorkloadError("--num-prompts must be >= --prefix-repetition-num-prefixes")
    if prefix_len + suffix_len <= 0:
        raise WorkloadError("--prefix-repetition-prefix-len + suffix-len must be > 0")
    ids = np.random.RandomState(seed)
    out: list[SimRequest] = []
    for _ in range(num_prefixes):
        prefix = ids.randint(0, vocab, size=prefix_len).tolist()
        for _ in range(per):
            out.append(
                SimRequest(prefix + ids.randint(0, vocab, size=suffix_len).tolist(), output_len)
            )
    if shuffle:
        random.Random(seed).shuffle(out)
    return out


def shared_prefix_dataset(
    vocab: int,
    groups: int,
    per_group: int,
    system_len: int,
    question_len: int,
    output_len: int,
    ratio: float,
    seed: int,
    shuffle: bool,
) -> list[SimRequest]:
    _positive(groups, "--gsp-num-groups")
    _positive(per_group, "--gsp-prompts-per-group")
    if not 0.0 <= ratio <= 1.0:
        raise WorkloadError(f"--gsp-range-ratio must be in [0, 1], got {ratio}")
    lengths = np.random.RandomState(seed)

    def lens(full: int, num: int) -> list[int]:
        if full <= 0:
            return [0] * num
        return lengths.randint(max(int(full * ratio), 1), full + 1, size=num).tolist()

    total = groups * per_group
    system_lens, question_lens = lens(system_len, groups), lens(question_len, total)
    output_lens = lens(output_len, total)
    tokens = random.Random(seed)
    vocab_ids = range(vocab)
    systems = [tokens.choices(vocab_ids, k=k) for k in system_lens]
    questions = [tokens.choices(vocab_ids, k=k) for k in question_lens]
    out = [SimRequest(systems[i // per_group] + questions[i], output_lens[i]) for i in range(total)]
    if shuffle:
        tokens.shuffle(out)
    return out


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    _positive(rate, "--request-rate")
    _positive(burstiness, "--burstiness")
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    times = np.cumsum(gaps)
    if times[-1] > 0:
        times *= (n / rate) / times[-1]
    return times.tolist()
