"""vLLM's `random` dataset on token ids (docs/benchmarking.md "Datasets").

Definition (vLLM `RandomDataset`), reproduced with one `numpy.random.default_rng(seed)`:
* input lengths uniform over the integers in `[floor(L*(1-r)), ceil(L*(1+r))]`, output
  lengths likewise with a floor of 1, `r` = `--random-range-ratio` in `[0, 1)`;
* then one offset per request uniform in `[0, vocab)`;
* one shared prefix of `--random-prefix-len` ids drawn uniformly from the allowed ids;
* request i's own ids are `allowed[(offset_i + i + arange(len_i)) % len(allowed)]`.
The prompt is prefix + own ids, so its length is `prefix_len + len_i`. Not shuffled.
`allowed` is the vocabulary minus special ids (none are known without a tokenizer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from relaykv.common.workloads.sample import (
    DatasetError,
    SampleRequest,
    require_non_negative,
    require_positive,
)

DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128
DEFAULT_RANGE_RATIO = 0.0
DEFAULT_PREFIX_LEN = 0


def length_bounds(length: int, range_ratio: float, floor_one: bool = False) -> tuple[int, int]:
    """Inclusive integer bounds `[floor(L*(1-r)), ceil(L*(1+r))]` (vLLM's rule)."""
    low = math.floor(length * (1 - range_ratio))
    high = math.ceil(length * (1 + range_ratio))
    if floor_one:
        low, high = max(low, 1), max(high, 1)
    return low, high


def random_requests(
    num_requests: int,
    vocab_size: int,
    *,
    input_len: int = DEFAULT_INPUT_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    range_ratio: float = DEFAULT_RANGE_RATIO,
    prefix_len: int = DEFAULT_PREFIX_LEN,
    seed: int = 0,
    special_ids: Iterable[int] = (),
) -> list[SampleRequest]:
    require_positive(num_requests, "--num-prompts")
    require_non_negative(input_len, "--random-input-len")
    require_non_negative(output_len, "--random-output-len")
    require_non_negative(prefix_len, "--random-prefix-len")
    if not 0.0 <= range_ratio < 1.0:
        raise DatasetError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    in_low, in_high = length_bounds(input_len, range_ratio)
    if prefix_len + in_low < 1:
        raise DatasetError(
            "--random-input-len is too small: prefix_len + floor(input_len * (1 - ratio)) "
            f"= {prefix_len + in_low}, every prompt needs at least 1 token"
        )
    out_low, out_high = length_bounds(output_len, range_ratio, floor_one=True)
    allowed = allowed_ids(vocab_size, special_ids)

    rng = np.random.default_rng(seed)
    input_lens = rng.integers(in_low, in_high + 1, size=num_requests)
    output_lens = rng.integers(out_low, out_high + 1, size=num_requests)
    offsets = rng.integers(0, vocab_size, size=num_requests)
    prefix = allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist() if prefix_len else []

    requests = []
    for i in range(num_requests):
        own = allowed[(int(offsets[i]) + i + np.arange(int(input_lens[i]))) % len(allowed)]
        requests.append(SampleRequest(prefix + own.tolist(), int(output_lens[i])))
    return requests


def allowed_ids(vocab_size: int, special_ids: Iterable[int] = ()) -> np.ndarray:
    """The vocabulary `[0, vocab_size)` minus the special ids, as an int64 array."""
    require_positive(vocab_size, "--vocab-size")
    special = np.array(sorted({int(t) for t in special_ids}), dtype=np.int64)
    allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), special)
    if len(allowed) == 0:
        raise DatasetError("--vocab-size leaves no non-special token ids to sample from")
    return allowed
