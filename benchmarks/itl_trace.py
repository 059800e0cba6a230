"""Which steps make a `relaykv bench ab` group's largest inter-token gaps (docs/routing.md,
"The c4 waves, traced").

Reads the `results/<run>-<group>.json` files of a `bench ab --save-detailed` run (the
requests' per-chunk times and every engine's steps, `GET /steps`, on the same host's clock)
and prints, per run: its P99 ITL, its largest gaps with the engine steps that ran meanwhile
(role, what each step did for its batch, how long it took), and the decode engines' steps
that prefilled a prompt themselves (local requests): how many shared their batch with other
sequences and how many ran while a measured stream was between its first and last token.

    python benchmarks/itl_trace.py bench-ab-20261203-151200 --group gsp_c4_output32 --top 5
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

from relaykv.bench.metrics import summarize


class Gap(NamedTuple):
    seconds: float
    stream: int  # the request's index in the group
    index: int  # which gap of that stream
    start: float  # the chunk before it (the client's clock)
    end: float


class LocalSteps(NamedTuple):
    steps: int
    shared: int  # with other sequences in the batch
    during_streams: int  # while a measured stream was between its first and last token


def gaps(result: dict[str, Any]) -> list[Gap]:
    """Every inter-token gap of the result's requests, largest first."""
    out = []
    for i, (sent, ttft, itls) in enumerate(
        zip(result["start_times"], result["ttfts"], result["itls"], strict=True)
    ):
        t = sent + ttft
        for j, g in enumerate(itls):
            out.append(Gap(g, i, j, t, t + g))
            t += g
    return sorted(out, reverse=True)


def steps_between(result: dict[str, Any], start: float, end: float) -> list[tuple[str, dict]]:
    """(role, step) of every engine step that overlapped [start, end], in time order."""
    found = [
        (role, step)
        for role, engines in result.get("engine_steps", {}).items()
        for steps in engines.values()
        for step in steps
        if step["start"] < end and step["end"] > start
    ]
    return sorted(found, key=lambda rs: rs[1]["start"])


def local_steps(result: dict[str, Any]) -> LocalSteps:
    """The decode engines' steps that computed prompt tokens (local requests)."""
    streaming = [
        (sent + ttft, sent + ttft + sum(itls))
        for sent, ttft, itls in zip(
            result["start_times"], result["ttfts"], result["itls"], strict=True
        )
    ]
    local = [
        step
        for steps in result.get("engine_steps", {}).get("decode", {}).values()
        for step in steps
        if any(w["kind"] == "prefill" for w in step["work"])
    ]
    return LocalSteps(
        len(local),
        sum(len(step["work"]) > 1 for step in local),
        sum(any(a < step["end"] and step["start"] < b for a, b in streaming) for step in local),
    )


def describe(role: str, step: dict) -> str:
    kinds: dict[str, int] = {}
    for w in step["work"]:
        kinds[w["kind"]] = kinds.get(w["kind"], 0) + 1
    what = "+".join(f"{n}x{kind}" for kind, n in sorted(kinds.items()))
    return f"{role[0].upper()}[{what} {(step['end'] - step['start']) * 1000:.0f} ms]"


def report(result: dict[str, Any], top: int) -> list[str]:
    every = gaps(result)
    if not every:
        return ["  no inter-token gaps"]
    sent = result["start_times"]
    ((_, p99_ms),) = summarize([g.seconds for g in every], [99.0]).percentiles_ms  # as bench
    lines = [f"  P99 ITL {p99_ms:.1f} ms over {len(every)} gaps"]
    for g in every[:top]:
        steps = " ".join(describe(role, s) for role, s in steps_between(result, g.start, g.end))
        lines.append(
            f"  {g.seconds * 1000:6.1f} ms  request {g.stream} gap {g.index} "
            f"at +{(g.start - sent[g.stream]) * 1000:.0f} ms after its send: "
            f"{steps or 'no engine step recorded'}"
        )
    if "engine_steps" in result:
        local = local_steps(result)
        lines.append(
            f"  decode-engine prefill steps {local.steps}: {local.shared} shared a batch, "
            f"{local.during_streams} ran while a measured stream streamed"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", type=Path, help="a `bench ab --save-detailed` output")
    parser.add_argument("--group", default="", help="the group's file name part, e.g. gsp_c4")
    parser.add_argument("--top", type=int, default=5, help="largest gaps to show per run")
    args = parser.parse_args(argv)
    files = sorted((args.output_dir / "results").glob(f"*-*{args.group}*.json"))
    if not files:
        print(f"no results/*{args.group}*.json under {args.output_dir}", file=sys.stderr)
        return 2
    for path in files:
        result = json.loads(path.read_text())
        if "itls" not in result:
            print(f"{path.name}: no per-request arrays (run bench ab with --save-detailed)")
            continue
        print(path.stem)
        print("\n".join(report(result, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
