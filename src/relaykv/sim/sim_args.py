"""Flags of `relaykv sim`: the cluster, and `bench serve`'s dataset and load flags.

Dataset and load flags keep `relaykv bench serve`'s names and defaults (docs/benchmarking.md) so a
command line moves between the two unchanged; flags that only concern a real server
(URLs, tokenizer, result files of bench serve) do not exist here.
"""

from __future__ import annotations

import argparse
import re

from relaykv.engine import SchedulerConfig
from relaykv.kvcache import PD_POLICIES
from relaykv.kvcache.retention import ENGINE_RETENTION_HELP
from relaykv.router.policy import (
    DEFAULT_CONDITIONAL_MAX_QUEUED_PREFILL,
    DISAGGREGATION_MODES,
    ROUTING_MODES,
)
from relaykv.sim.cluster import ClusterSpec
from relaykv.sim.hardware import HardwareSpec, LinkSpec, calibrated_acceptance
from relaykv.sim.models import ModelSpec
from relaykv.sim.workload import (
    DATASETS,
    SimRequest,
    WorkloadError,
    prefix_repetition_dataset,
    random_dataset,
    shared_prefix_dataset,
)

_SIZE = re.compile(r"^\s*([0-9.]+)\s*([KMGT]i?B?|B?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`80GiB`, `80GB`, `512MiB`, `1000000` -> bytes (Ki/Mi/Gi/Ti: powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected a size such as 40GiB, got {text!r}")
    unit = m.group(2).upper().rstrip("B")
    scale = {
        "": 1,
        "K": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "KI": 1 << 10,
        "MI": 1 << 20,
        "GI": 1 << 30,
        "TI": 1 << 40,
    }[unit]
    return int(float(m.group(1)) * scale)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cluster")
    g.add_argument(
        "--model",
        default="tiny-hybrid",
        help="tiny-hybrid, gemma3-270m, gpt-oss-20b, dsv4-flash, or a config.json",
    )
    g.add_argument(
        "--hardware", default="h100", help="h20, h100, h200, b200, or a calibration file"
    )
    g.add_argument("--prefill-tp", type=int, default=1)
    g.add_argument("--decode-tp", type=int, default=1)
    g.add_argument("--num-prefill", type=int, default=1, help="0: colocated engines only")
    g.add_argument("--num-decode", type=int, default=1)
    g.add_argument(
        "--link",
        default=None,
        help="rdma, tcp-25g, tcp-100g, shm, Gb/s, or a calibration file (default: the "
        "--hardware file's link, else rdma)",
    )
    g.add_argument("--speculative-tokens", type=int, default=0)
    g.add_argument(
        "--acceptance-rate",
        type=float,
        default=None,
        help="EAGLE acceptance rate (default: the calibration file's measured one, else 0.7)",
    )
    g.add_argument("--pd-policy", default="all", choices=(*PD_POLICIES, "all"))
    pool = g.add_mutually_exclusive_group()
    pool.add_argument("--num-blocks", type=int, default=None, help="KV pool blocks per engine")
    pool.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=None,
        help="KV pool bytes per engine (default: the hardware's memory x TP x "
        "0.9 minus the weights)",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget per step (default: the hardware's, 8192 on GPUs)",
    )
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="default: the longest prompt + output of the workload",
    )
    g.add_argument("--retention", default="auto", help=ENGINE_RETENTION_HELP)
    g.add_argument(
        "--routing",
        default="cache-aware",
        choices=ROUTING_MODES,
        help="the router's policy (relaykv router --routing; default cache-aware)",
    )
    g.add_argument(
        "--disaggregation",
        default="always",
        choices=DISAGGREGATION_MODES,
        help="the router's --disaggregation (default here: always, every request P -> D; "
        "conditional: a sibling whose suffix on its decode engine is short is prefilled "
        "there, docs/routing.md)",
    )
    g.add_argument(
        "--conditional-max-suffix",
        type=int,
        default=None,
        help="default: the cost estimate from the hardware presets (docs/simulator.md)",
    )
    g.add_argument(
        "--conditional-max-queued-prefill",
        type=int,
        default=DEFAULT_CONDITIONAL_MAX_QUEUED_PREFILL,
    )
    g.add_argument(
        "--prefill-prefix-caching",
        default="on",
        choices=("on", "off"),
        help="off: prefill engines without prefix caching, the seed's baseline image "
        "(docs/simulator.md)",
    )


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    d = parser.add_argument_group("dataset (relaykv bench serve's flags)")
    d.add_argument("--dataset-name", default="random", choices=DATASETS)
    d.add_argument("--num-prompts", type=int, default=1000)
    d.add_argument("--seed", type=int, default=None)
    d.add_argument("--disable-shuffle", action="store_true")
    d.add_argument("--vocab-size", type=int, default=None, help="default: the model's")
    d.add_argument("--input-len", type=int, default=None)
    d.add_argument("--output-len", type=int, default=None)
    d.add_argument("--random-input-len", type=int, default=1024)
    d.add_argument("--random-output-len", type=int, default=128)
    d.add_argument("--random-range-ratio", type=float, default=0.0)
    d.add_argument("--random-prefix-len", type=int, default=0)
    d.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    d.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    d.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    d.add_argument("--prefix-repetition-output-len", type=int, default=128)
    d.add_argument("--gsp-num-groups", type=int, default=64)
    d.add_argument("--gsp-prompts-per-group", type=int, default=16)
    d.add_argument("--gsp-system-prompt-len", type=int, default=2048)
    d.add_argument("--gsp-question-len", type=int, default=128)
    d.add_argument("--gsp-output-len", type=int, default=256)
    d.add_argument("--gsp-range-ratio", type=float, default=1.0)
    d.add_argument("--gsp-ordered", action="store_true")
    load = parser.add_argument_group("load")
    load.add_argument("--request-rate", type=float, default=float("inf"))
    load.add_argument("--burstiness", type=float, default=1.0)
    load.add_argument("--max-concurrency", type=int, default=None)
    load.add_argument("--num-warmups", type=int, default=0)
    load.add_argument(
        "--ignore-eos",
        action="store_true",
        help="accepted for bench serve compatibility: simulated outputs never "
        "stop early (every request generates its output length)",
    )


def build_requests(args: argparse.Namespace, model_vocab: int) -> list[SimRequest]:
    vocab = args.vocab_size or model_vocab
    out_len = args.output_len
    if args.dataset_name == "random":
        return random_dataset(
            args.num_prompts,
            vocab,
            args.input_len or args.random_input_len,
            out_len or args.random_output_len,
            args.random_range_ratio,
            args.random_prefix_len,
            args.seed or 0,
        )
    if args.dataset_name == "prefix_repetition":
        return prefix_repetition_dataset(
            args.num_prompts,
            vocab,
            args.prefix_repetition_prefix_len,
            args.prefix_repetition_suffix_len,
            args.prefix_repetition_num_prefixes,
            out_len or args.prefix_repetition_output_len,
            args.seed or 0,
            not args.disable_shuffle,
        )
    if args.dataset_name == "generated-shared-prefix":
        return shared_prefix_dataset(
            vocab,
            args.gsp_num_groups,
            args.gsp_prompts_per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            out_len or args.gsp_output_len,
            args.gsp_range_ratio,
            42 if args.seed is None else args.seed,
            not (args.gsp_ordered or args.disable_shuffle),
        )
    raise WorkloadError(f"--dataset-name {args.dataset_name!r} is not supported")


def pool_blocks(
    model: ModelSpec, hw: HardwareSpec, tp: int, geometry_block_bytes: int, kv_memory: int | None
) -> int:
    """KV blocks of one engine: `--kv-cache-memory`, the calibration's pool, or 90 % of the
    engine's memory minus its weights."""
    if kv_memory is None and hw.kv_cache_memory:
        kv_memory = int(hw.kv_cache_memory)
    if kv_memory is None:
        weights = model.dense_params * model.dense_weight_bytes + (
            model.expert_params * model.expert_weight_bytes
        )
        kv_memory = int(hw.memory_bytes * tp * 0.9 - weights)
    return max(2, kv_memory // geometry_block_bytes)


def cluster_spec(
    args: argparse.Namespace,
    model: ModelSpec,
    hw: HardwareSpec,
    link: LinkSpec,
    requests: list[SimRequest],
    parser: argparse.ArgumentParser,
) -> ClusterSpec:
    for flag in ("prefill_tp", "decode_tp", "num_decode", "max_num_seqs"):
        if getattr(args, flag) < 1:
            parser.error(f"argument --{flag.replace('_', '-')}: must be >= 1")
    if args.num_prefill < 0 or args.speculative_tokens < 0:
        parser.error("argument --num-prefill/--speculative-tokens: must be >= 0")
    for flag in ("conditional_max_suffix", "conditional_max_queued_prefill"):
        value = getattr(args, flag, None)
        if value is not None and value < 0:
            parser.error(f"argument --{flag.replace('_', '-')}: must be >= 0")
    if args.acceptance_rate is None:
        args.acceptance_rate = calibrated_acceptance(args.hardware) or 0.7
    if not 0.0 <= args.acceptance_rate <= 1.0:
        parser.error("argument --acceptance-rate: must be in [0, 1]")
    k = args.speculative_tokens
    longest = max(len(r.prompt) + r.output_len for r in requests)
    max_len = args.max_model_len or longest + k + 2
    geometry = model.geometry(with_draft=k > 0)
    blocks = args.num_blocks or min(
        pool_blocks(model, hw, args.prefill_tp, geometry.block_bytes, args.kv_cache_memory),
        pool_blocks(model, hw, args.decode_tp, geometry.block_bytes, args.kv_cache_memory),
    )
    if blocks < 2:
        parser.error("argument --num-blocks: must be >= 2")
    sched = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens or hw.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=max_len,
    )
    return ClusterSpec(
        model=model,
        hardware=hw,
        link=link,
        num_prefill=args.num_prefill,
        num_decode=args.num_decode,
        prefill_tp=args.prefill_tp,
        decode_tp=args.decode_tp,
        num_speculative_tokens=k,
        acceptance_rate=args.acceptance_rate,
        num_blocks=blocks,
        scheduler=sched,
        retention=args.retention,
        prefill_prefix_caching=args.prefill_prefix_caching == "on",
        routing=args.routing,
        disaggregation=getattr(args, "disaggregation", "always"),
        conditional_max_suffix=getattr(args, "conditional_max_suffix", None),
        conditional_max_queued_prefill=getattr(
            args, "conditional_max_queued_prefill", DEFAULT_CONDITIONAL_MAX_QUEUED_PREFILL
        ),
    )
