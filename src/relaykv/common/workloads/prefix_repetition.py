"""vLLM's `prefix_repetition` dataset on token ids (docs/benchmarking.md "Datasets").

Definition (vLLM `PrefixRepetitionRandomDataset`): `prompts_per_prefix = num_prompts //
num_prefixes` (an error when 0), so `num_prefixes * prompts_per_prefix` requests; for each
prefix in turn draw `prefix_len` ids, then for each of its prompts draw `suffix_len` ids;
prompt = prefix + suffix; every request asks for `output_len` tokens; then shuffle unless
`--disable-shuffle`.

The draws use `numpy.random.RandomState(seed).randint(0, vocab_size, n)` and the shuffle
`random.Random(seed).shuffle`, which is what vLLM's seeded globals produce, so for the same
seed and vocabulary size the ids equal vLLM's before its decode/re-encode step.
"""

from __future__ import annotations

import random

import numpy as np

from relaykv.common.workloads.sample import (
    DatasetError,
    SampleRequest,
    require_non_negative,
    require_positive,
)

DEFAULT_PREFIX_LEN = 256
DEFAULT_SUFFIX_LEN = 256
DEFAULT_NUM_PREFIXES = 10
DEFAULT_OUTPUT_LEN = 128


def prefix_repetition_requests(
    num_requests: int,
    vocab_size: int,
    *,
    prefix_len: int = DEFAULT_PREFIX_LEN,
    suffix_len: int = DEFAULT_SUFFIX_LEN,
    num_prefixes: int = DEFAULT_NUM_PREFIXES,
    output_len: int = DEFAULT_OUTPUT_LEN,
    seed: int = 0,
    shuffle: bool = True,
) -> list[SampleRequest]:
    require_positive(num_requests, "--num-prompts")
    require_positive(vocab_size, "--vocab-size")
    require_non_negative(prefix_len, "--prefix-repetition-prefix-len")
    require_non_negative(suffix_len, "--prefix-repetition-suffix-len")
    require_positive(num_prefixes, "--prefix-repetition-num-prefixes")
    require_non_negative(output_len, "--prefix-repetition-output-len")
    if prefix_len + suffix_len == 0:
        raise DatasetError(
            "--prefix-repetition-prefix-len + --prefix-repetition-suffix-len must be > 0"
        )
    prompts_per_prefix = num_requests // num_prefixes
    if prompts_per_prefix == 0:
        raise DatasetError(
            f"--num-prompts ({num_requests}) must be >= --prefix-repetition-num-prefixes "
            f"({num_prefixes}): requests = num_prefixes * (num_prompts // num_prefixes) = 0"
        )
    ids = np.random.RandomState(seed)
    requests: list[SampleRequest] = []
    for _ in range(num_prefixes):
        prefix = ids.randint(0, vocab_size, size=prefix_len).tolist()
        for _ in range(prompts_per_prefix):
            suffix = ids.randint(0, vocab_size, size=suffix_len).tolist()
            requests.append(SampleRequest(prefix + suffix, output_len))
    if shuffle:
        random.Random(seed).shuffle(requests)
    return requests
