"""SGLang's `generated-shared-prefix` dataset on token ids (docs/benchmarking.md "Datasets").

Definition (SGLang `sample_generated_shared_prefix_requests`, uniform groups):
* lengths come from `compute_random_lens(L, r, n)` = integers uniform in
  `[max(int(L*r), 1), L]` (so the default `--gsp-range-ratio 1.0` gives exactly L; L <= 0
  gives 0): first one system-prompt length per group, then one question length per
  prompt, then one output length per prompt, all from `numpy.random.RandomState(seed)`;
* one random system prompt per group, then one random question per prompt (group-major),
  ids drawn uniformly from the vocabulary with `random.Random(seed)`;
* prompt = system prompt + question (SGLang joins the texts with a blank line; on ids the
  two sequences are concatenated), total = groups * prompts per group (`--num-prompts` is
  ignored); shuffled unless ordered. Seed default 42 (SGLang's generator).
"""

from __future__ import annotations

import random
from typing import cast

import numpy as np

from relaykv.common.workloads.sample import (
    DatasetError,
    SampleRequest,
    require_non_negative,
    require_positive,
)

DEFAULT_NUM_GROUPS = 64
DEFAULT_PROMPTS_PER_GROUP = 16
DEFAULT_SYSTEM_PROMPT_LEN = 2048
DEFAULT_QUESTION_LEN = 128
DEFAULT_OUTPUT_LEN = 256
DEFAULT_RANGE_RATIO = 1.0
DEFAULT_SEED = 42


def sglang_random_lens(
    lengths: np.random.RandomState, full_len: int, range_ratio: float, num: int
) -> list[int]:
    """SGLang's `compute_random_lens`: uniform integers in `[max(int(L*r), 1), L]`."""
    if full_len <= 0:
        return [0] * num
    low = max(int(full_len * range_ratio), 1)
    return cast(list[int], lengths.randint(low, full_len + 1, size=num).tolist())


def generated_shared_prefix_requests(
    vocab_size: int,
    *,
    num_groups: int = DEFAULT_NUM_GROUPS,
    prompts_per_group: int = DEFAULT_PROMPTS_PER_GROUP,
    system_prompt_len: int = DEFAULT_SYSTEM_PROMPT_LEN,
    question_len: int = DEFAULT_QUESTION_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    range_ratio: float = DEFAULT_RANGE_RATIO,
    seed: int = DEFAULT_SEED,
    shuffle: bool = True,
) -> list[SampleRequest]:
    require_positive(vocab_size, "--vocab-size")
    require_positive(num_groups, "--gsp-num-groups")
    require_positive(prompts_per_group, "--gsp-prompts-per-group")
    require_non_negative(system_prompt_len, "--gsp-system-prompt-len")
    require_non_negative(question_len, "--gsp-question-len")
    require_non_negative(output_len, "--gsp-output-len")
    if not 0.0 <= range_ratio <= 1.0:
        raise DatasetError(f"--gsp-range-ratio must be in [0, 1], got {range_ratio}")
    if system_prompt_len + question_len == 0:
        raise DatasetError("--gsp-system-prompt-len + --gsp-question-len must be > 0")

    lengths = np.random.RandomState(seed)
    total = num_groups * prompts_per_group
    system_lens = sglang_random_lens(lengths, system_prompt_len, range_ratio, num_groups)
    question_lens = sglang_random_lens(lengths, question_len, range_ratio, total)
    output_lens = sglang_random_lens(lengths, output_len, range_ratio, total)

    tokens = random.Random(seed)
    vocab = range(vocab_size)
    systems = [tokens.choices(vocab, k=n) for n in system_lens]
    questions = [tokens.choices(vocab, k=n) for n in question_lens]

    requests = [
        SampleRequest(systems[slot // prompts_per_group] + questions[slot], output_lens[slot])
        for slot in range(total)
    ]
    if shuffle:
        tokens.shuffle(requests)
    return requests
