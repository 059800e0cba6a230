"""The dataset and load flags `relaykv bench serve` and `relaykv sim` share: vLLM `bench
serve`'s names and defaults (SGLang's for `--gsp-*`), and the requests they name
(docs/benchmarking.md "Datasets"). Errors are `DatasetError`s naming the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from relaykv.common.workloads import prefix_repetition as pr
from relaykv.common.workloads import random_ids as rnd
from relaykv.common.workloads import shared_prefix as gsp
from relaykv.common.workloads.prefix_repetition import prefix_repetition_requests
from relaykv.common.workloads.random_ids import random_requests
from relaykv.common.workloads.sample import SampleRequest
from relaykv.common.workloads.shared_prefix import generated_shared_prefix_requests

DATASET_NAMES: tuple[str, ...] = ("random", "prefix_repetition", "generated-shared-prefix")


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dataset")
    group.add_argument("--dataset-name", default="random", choices=DATASET_NAMES)
    group.add_argument("--num-prompts", type=int, default=1000)
    group.add_argument(
        "--seed",
        type=int,
        default=None,
        help="dataset and arrival seed (default 0; 42 for generated-shared-prefix)",
    )
    group.add_argument(
        "--disable-shuffle", action="store_true", help="keep the dataset's generation order"
    )
    group.add_argument("--input-len", type=int, default=None, help="sets --random-input-len")
    group.add_argument(
        "--output-len", type=int, default=None, help="sets every dataset's output length"
    )
    group.add_argument("--random-input-len", type=int, default=rnd.DEFAULT_INPUT_LEN)
    group.add_argument("--random-output-len", type=int, default=rnd.DEFAULT_OUTPUT_LEN)
    group.add_argument("--random-range-ratio", type=float, default=rnd.DEFAULT_RANGE_RATIO)
    group.add_argument("--random-prefix-len", type=int, default=rnd.DEFAULT_PREFIX_LEN)
    group.add_argument("--prefix-repetition-prefix-len", type=int, default=pr.DEFAULT_PREFIX_LEN)
    group.add_argument("--prefix-repetition-suffix-len", type=int, default=pr.DEFAULT_SUFFIX_LEN)
    group.add_argument(
        "--prefix-repetition-num-prefixes", type=int, default=pr.DEFAULT_NUM_PREFIXES
    )
    group.add_argument("--prefix-repetition-output-len", type=int, default=pr.DEFAULT_OUTPUT_LEN)
    group.add_argument("--gsp-num-groups", type=int, default=gsp.DEFAULT_NUM_GROUPS)
    group.add_argument("--gsp-prompts-per-group", type=int, default=gsp.DEFAULT_PROMPTS_PER_GROUP)
    group.add_argument("--gsp-system-prompt-len", type=int, default=gsp.DEFAULT_SYSTEM_PROMPT_LEN)
    group.add_argument("--gsp-question-len", type=int, default=gsp.DEFAULT_QUESTION_LEN)
    group.add_argument("--gsp-output-len", type=int, default=gsp.DEFAULT_OUTPUT_LEN)
    group.add_argument("--gsp-range-ratio", type=float, default=gsp.DEFAULT_RANGE_RATIO)
    group.add_argument(
        "--gsp-ordered", action="store_true", help="do not shuffle generated-shared-prefix requests"
    )


def add_arrival_arguments(group: argparse._ActionsContainer) -> None:
    """The load flags: when requests are sent (`arrivals`) and how many at once."""
    group.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests/s; inf sends all at once, else Poisson (or gamma)",
    )
    group.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps; 1 = Poisson"
    )
    group.add_argument("--max-concurrency", type=int, default=None)
    group.add_argument(
        "--num-warmups",
        type=int,
        default=0,
        help="copies of the first request sent before measuring",
    )


def dataset_seed(args: argparse.Namespace) -> int:
    if args.seed is not None:
        return int(args.seed)
    return gsp.DEFAULT_SEED if args.dataset_name == "generated-shared-prefix" else 0


def apply_general_lengths(args: argparse.Namespace) -> None:
    """vLLM's `--input-len`/`--output-len` shortcuts onto the dataset flags."""
    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        args.random_output_len = args.output_len
        args.prefix_repetition_output_len = args.output_len
        args.gsp_output_len = args.output_len


def build_requests(
    args: argparse.Namespace, vocab_size: int, special_ids: Sequence[int] = (), num_special: int = 0
) -> list[SampleRequest]:
    """The dataset named by `--dataset-name` (raises DatasetError naming the flag)."""
    seed = dataset_seed(args)
    shuffle = not args.disable_shuffle
    if args.dataset_name == "random":
        return random_requests(
            args.num_prompts,
            vocab_size,
            input_len=max(0, args.random_input_len - num_special),
            output_len=args.random_output_len,
            range_ratio=args.random_range_ratio,
            prefix_len=args.random_prefix_len,
            seed=seed,
            special_ids=special_ids,
        )
    if args.dataset_name == "prefix_repetition":
        return prefix_repetition_requests(
            args.num_prompts,
            vocab_size,
            prefix_len=args.prefix_repetition_prefix_len,
            suffix_len=args.prefix_repetition_suffix_len,
            num_prefixes=args.prefix_repetition_num_prefixes,
            output_len=args.prefix_repetition_output_len,
            seed=seed,
            shuffle=shuffle,
        )
    return generated_shared_prefix_requests(
        vocab_size,
        num_groups=args.gsp_num_groups,
        prompts_per_group=args.gsp_prompts_per_group,
        system_prompt_len=args.gsp_system_prompt_len,
        question_len=args.gsp_question_len,
        output_len=args.gsp_output_len,
        range_ratio=args.gsp_range_ratio,
        seed=seed,
        shuffle=shuffle and not args.gsp_ordered,
    )


