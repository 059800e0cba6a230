"""`relaykv cache-probe`: the engine developer's "what will my hit be?" tool."""

from __future__ import annotations

import argparse
import json
from typing import Any

from relaykv.cache_probe.engine import run_vllm_probe
from relaykv.cache_probe.probe import FOLLOW_UPS, run_probe
from relaykv.kvcache.geometry import (
    EAGLE_REUSE_CACHE_ONLY,
    PRESETS,
    Geometry,
    parse_groups,
    preset,
)
from relaykv.kvcache.pd_config import PD_POLICIES, PDPolicy
from relaykv.kvcache.retention import RETENTION_HELP, parse_retention

ENGINES = ("relaykv", "vllm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--groups", help="KV groups, e.g. full:16,sliding:16:128")
    shape.add_argument(
        "--preset", choices=sorted(PRESETS), help="a preset geometry (default gpt-oss-like)"
    )
    parser.add_argument("--draft", default=None, help="index of the EAGLE draft group, or none")
    parser.add_argument("--eagle-reuse", choices=EAGLE_REUSE_CACHE_ONLY, default="drop")
    parser.add_argument("--retention", default="boundaries", help=RETENTION_HELP)
    parser.add_argument("--pd-policy", choices=[*PD_POLICIES, "all"], default="all")
    parser.add_argument("--prompt-len", type=int, default=1000, help="N, the prompt length")
    parser.add_argument("--extension-len", type=int, default=48)
    parser.add_argument("--sibling-diverge", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tier-blocks",
        type=int,
        default=None,
        metavar="N",
        help="also probe a colocated engine with a KV tier of N blocks whose device pool "
        "let everything go (docs/tier.md)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="relaykv",
        help="relaykv's cache manager (default), or vLLM 0.33's real scheduler with the "
        "relaykv.vllm plugin (legacy: stock vLLM); runs in the vLLM venv, tools/vllm_venv.sh",
    )


def build_geometry(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Geometry:
    if args.groups:
        try:
            geometry = Geometry(parse_groups(args.groups))
        except ValueError as exc:
            parser.error(f"argument --groups: {exc}")
    else:
        geometry = preset(args.preset or "gpt-oss-like")
    if args.draft is not None:
        if args.draft == "none":
            geometry = geometry.with_draft(None)
        else:
            try:
                geometry = geometry.with_draft(int(args.draft))
            except ValueError:
                parser.error(
                    f"argument --draft: expected a group index "
                    f"0..{geometry.num_groups - 1} or none,"
                    f" got {args.draft!r}"
                )
    return geometry.with_eagle_reuse(args.eagle_reuse)


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace, geometry: Geometry) -> None:
    if args.prompt_len < 2:
        parser.error(f"argument --prompt-len: must be >= 2, got {args.prompt_len}")
    if args.extension_len < 1:
        parser.error(f"argument --extension-len: must be >= 1, got {args.extension_len}")
    if not 1 <= args.sibling_diverge < args.prompt_len:
        parser.error(
            f"argument --sibling-diverge: must be in 1..{args.prompt_len - 1}, "
            f"got {args.sibling_diverge}"
        )
    if args.tier_blocks is not None and args.tier_blocks < 0:
        parser.error(f"argument --tier-blocks: must be >= 0, got {args.tier_blocks}")
    try:
        parse_retention(args.retention, geometry.alignment)
    except ValueError as exc:
        parser.error(f"argument --retention: {exc}")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or argparse.ArgumentParser(prog="relaykv cache-probe")
    geometry = build_geometry(parser, args)
    validate(parser, args, geometry)
    if getattr(args, "engine", "relaykv") == "vllm":
        return run_vllm_probe(args, parser)
    results = [
        run_probe(
            geometry, policy, args.prompt_len, tier_blocks=args.tier_blocks, **probe_options(args)
        )
        for policy in selected_policies(args)
    ]
    print(render(geometry, args, results))
    return 0


def selected_policies(args: argparse.Namespace) -> list[PDPolicy]:
    return list(PDPolicy) if args.pd_policy == "all" else [PDPolicy(args.pd_policy)]


def probe_options(args: argparse.Namespace) -> dict[str, Any]:
    """The probe's keyword arguments from the command line (both engines take them)."""
    return dict(
        retention=args.retention,
        extension_len=args.extension_len,
        sibling_diverge=args.sibling_diverge,
        seed=args.seed,
    )


def render(geometry: Geometry, args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    """The command's output: JSON (a list for `--pd-policy all`) or the table."""
    if args.json:
        return json.dumps(results if args.pd_policy == "all" else results[0])
    return format_table(geometry, args, results)


def format_table(
    geometry: Geometry, args: argparse.Namespace, results: list[dict[str, Any]]
) -> str:
    colocated = results[0]["colocated"]
    lines = [
        f"geometry: {geometry.describe()}",
        f"prompt N={args.prompt_len}, extension +{args.extension_len}, sibling diverges "
        f"{args.sibling_diverge} tokens before the end, retention={args.retention}",
        "colocated engine hits: " + ", ".join(f"{k} {colocated[k]}" for k in FOLLOW_UPS),
    ]
    tier = results[0].get("tier")
    if tier is not None:
        lines.append(
            f"with a KV tier of {tier['tier_blocks']} blocks, device pool flushed: "
            + ", ".join(
                f"{k} {tier[k]['hit']} ({tier[k]['from_tier']} from the tier)" for k in FOLLOW_UPS
            )
        )
    lines += [
        "",
        "decode engine (D): local tokens reused / blocks received per group",
    ]
    header = ["policy", "first_load", *FOLLOW_UPS]
    rows = [header]
    for result in results:
        decode = result["decode"]
        rows.append(
            [result["pd_policy"]]
            + [
                f"{decode[name]['local_tokens']} / {decode[name]['received_blocks']}"
                for name in header[1:]
            ]
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines.append(fmt.format(*rows[0]))
    lines.append(fmt.format(*("-" * w for w in widths)))
    lines.extend(fmt.format(*row) for row in rows[1:])
    return "\n".join(lines)
