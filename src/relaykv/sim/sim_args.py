"""Flags of `relaykv sim`: the cluster, and `bench serve`'s dataset and load flags.

Dataset and load flags keep `relaykv bench serve`'s names and defaults (docs/benchmarking.md) so a
command line moves between the two unchanged; flags that only concern a real server
(URLs, tokenizer, result files of bench serve) do not exist here.
"""

from __future__ import annotations

import argparse
import os
import re

from relaykv.common.workloads import SampleRequest
from relaykv.common.workloads.flags import (
    add_arrival_arguments,
    add_dataset_arguments,
    apply_general_lengths,
)
from relaykv.common.workloads.flags import build_requests as requests_for_flags
from relaykv.engine import SchedulerConfig
from relaykv.kvcache import PD_POLICIES
from relaykv.kvcache.retention import ENGINE_RETENTION_HELP
from relaykv.router.policy import (
    DEFAULT_CONDITIONAL_MAX_RUNNING,
    DISAGGREGATION_MODES,
    ROUTING_MODES,
)
from relaykv.sim.cluster import ClusterSpec
from relaykv.sim.hardware import (
    HardwareSpec,
    LinkSpec,
    calibrated_acceptance,
    check_conditions,
    is_calibration,
)
from relaykv.sim.models import ModelSpec
from relaykv.sim.tier import DEFAULT_TIER_BANDWIDTH

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
        "--draft-model",
        default="shipped",
        choices=("shipped", "random"),
        help="the EAGLE draft with --speculative-tokens: the model's shipped one (relaykv "
        "serve's default) or random (--draft-model random); a calibration file must match",
    )
    g.add_argument(
        "--torch-threads",
        type=_positive_int,
        default=None,
        metavar="N",
        help="torch threads per engine (default: relaykv up's, torch's own: one per core or "
        "$OMP_NUM_THREADS); a calibration file must have timed the same",
    )
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
        default=None,
        help="the router's --conditional-max-queued-prefill (default: the max suffix)",
    )
    g.add_argument(
        "--conditional-max-running",
        type=int,
        default=DEFAULT_CONDITIONAL_MAX_RUNNING,
        help="the router's --conditional-max-running: the streams (requests asking for more "
        "than one token) decoding on a decode engine above which siblings go through P "
        f"(default {DEFAULT_CONDITIONAL_MAX_RUNNING})",
    )
    g.add_argument(
        "--kv-offloading-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="a KV tier of SIZE host memory per engine, e.g. 200GiB (docs/tier.md; default: "
        "none)",
    )
    g.add_argument(
        "--kv-offloading-bandwidth",
        type=float,
        default=DEFAULT_TIER_BANDWIDTH / 1e9,
        metavar="GB/S",
        help="the tier's host<->device rate per direction (default: "
        f"{DEFAULT_TIER_BANDWIDTH / 1e9:g}, PCIe Gen5 x16 sustained)",
    )
    g.add_argument("--kv-offloading-interval", type=int, default=None, metavar="N")
    g.add_argument(
        "--prefill-prefix-caching",
        default="on",
        choices=("on", "off"),
        help="off: prefill engines without prefix caching, the baseline image of the "
        "upstream report, vLLM PR #56449 (docs/simulator.md)",
    )


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataset_arguments(parser)
    parser.add_argument_group("vocabulary").add_argument(
        "--vocab-size", type=int, default=None, help="default: the model's"
    )
    load = parser.add_argument_group("load")
    add_arrival_arguments(load)
    load.add_argument(
        "--ignore-eos",
        action="store_true",
        help="accepted for bench serve compatibility: simulated outputs never "
        "stop early (every request generates its output length)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def torch_threads(args: argparse.Namespace) -> int:
    """The torch threads per engine the run asks for: `--torch-threads`, else what an engine
    of `relaykv up` gets by default (`$OMP_NUM_THREADS`, else torch's own count)."""
    if args.torch_threads:
        return int(args.torch_threads)
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    import torch

    return int(torch.get_num_threads())


def build_requests(args: argparse.Namespace, model_vocab: int) -> list[SampleRequest]:
    """The requests `relaykv bench serve` would send for these flags (`--vocab-size`, else
    the model's vocabulary); raises DatasetError naming the flag."""
    apply_general_lengths(args)
    return requests_for_flags(args, args.vocab_size or model_vocab)


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
    requests: list[SampleRequest],
    parser: argparse.ArgumentParser,
) -> ClusterSpec:
    for flag in ("prefill_tp", "decode_tp", "num_decode", "max_num_seqs"):
        if getattr(args, flag) < 1:
            parser.error(f"argument --{flag.replace('_', '-')}: must be >= 1")
    if args.num_prefill < 0 or args.speculative_tokens < 0:
        parser.error("argument --num-prefill/--speculative-tokens: must be >= 0")
    for flag in (
        "conditional_max_suffix", "conditional_max_queued_prefill", "conditional_max_running"
    ):
        value = getattr(args, flag, None)
        if value is not None and value < 0:
            parser.error(f"argument --{flag.replace('_', '-')}: must be >= 0")
    if is_calibration(args.hardware):
        mismatch = check_conditions(
            args.hardware,
            args.model,
            args.speculative_tokens,
            args.draft_model,
            torch_threads(args),
        )
        if mismatch is not None:
            parser.error(f"argument {mismatch[0]}: {mismatch[1]}")
    if args.acceptance_rate is None:
        args.acceptance_rate = calibrated_acceptance(args.hardware) or 0.7
    if not 0.0 <= args.acceptance_rate <= 1.0:
        parser.error("argument --acceptance-rate: must be in [0, 1]")
    if not args.kv_offloading_bandwidth > 0:
        parser.error("argument --kv-offloading-bandwidth: must be > 0")
    if args.kv_offloading_interval is not None and args.kv_offloading_interval < 1:
        parser.error("argument --kv-offloading-interval: must be >= 1")
    k = args.speculative_tokens
    longest = max(r.prompt_len + r.output_len for r in requests)
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
        conditional_max_queued_prefill=getattr(args, "conditional_max_queued_prefill", None),
        conditional_max_running=getattr(
            args, "conditional_max_running", DEFAULT_CONDITIONAL_MAX_RUNNING
        ),
        kv_offloading_size=args.kv_offloading_size,
        kv_offloading_bandwidth=args.kv_offloading_bandwidth * 1e9,
        kv_offloading_interval=args.kv_offloading_interval,
    )
