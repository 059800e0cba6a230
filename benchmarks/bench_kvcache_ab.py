"""Before/after cost of the cache manager in one run: the same per-request work as
`bench_kvcache.py` (65,536-token prompt, gpt-oss-like, miss then hit), timed alternately on an
older checkout's `src/` (`--before`) and on this tree's, A/B/A/B in fresh subprocesses, so both
see the same machine load. Prints the per-phase medians and the ratio after/before (below 1:
faster now).

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/bench_kvcache_ab.py --before /tmp/before/src
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

PHASES = ("hash", "lookup", "allocate+cache", "free")

# Runs in the subprocess, against whichever `relaykv` is first on its path.
_TIMER = """
import json, random, statistics, sys, time
from array import array
from relaykv.kvcache import KVCacheManager, preset
n, repeat, seed = (int(x) for x in sys.argv[1:4])
m = KVCacheManager(preset("gpt-oss-like"), 4 * (n // 16) + 64)
release = getattr(m, "release", None) or m.free
rng = random.Random(seed)
out = {c: {p: [] for p in ("hash", "lookup", "allocate+cache", "free")} for c in ("miss", "hit")}
for i in range(repeat):
    prompt = array("i", [rng.randrange(200_000) for _ in range(n)])
    for case in ("miss", "hit"):
        t0 = time.perf_counter(); req = m.add_request(f"{case}{i}", prompt)
        t1 = time.perf_counter(); hit = m._lookup(req)
        t2 = time.perf_counter(); assert m._allocate(req, n, hit=hit)
        m._cache(req, n); m._free_skipped(req, n)
        t3 = time.perf_counter(); release(req)
        t4 = time.perf_counter()
        for p, dt in zip(out[case], (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            out[case][p].append(dt * 1e3)
print(json.dumps(out))
"""


def run_once(src: Path, n: int, repeat: int, seed: int) -> dict[str, dict[str, list[float]]]:
    env_path = str(src.resolve())
    proc = subprocess.run(
        [sys.executable, "-c", _TIMER, str(n), str(repeat), str(seed)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout's src/")
    parser.add_argument("--after", type=Path, default=Path(__file__).parents[1] / "src")
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2, help="A/B pairs (default 2: A/B/A/B)")
    args = parser.parse_args()
    samples: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in range(args.rounds):
        for label, src in (("before", args.before), ("after", args.after)):
            print(f"round {r + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
            got = run_once(src, args.tokens, args.repeat, seed=r)
            into = samples.setdefault(label, {c: {p: [] for p in PHASES} for c in got})
            for case, phases in got.items():
                for phase, values in phases.items():
                    into[case][phase].extend(values)
    # The minimum is the figure least disturbed by other work on a shared machine.
    for name, stat in (("median", statistics.median), ("minimum", min)):
        print(f"{args.tokens}-token prompt, gpt-oss-like, {name} of {args.rounds * args.repeat}")
        print(f"{'case':<6}{'phase':<16}{'before ms':>11}{'after ms':>10}{'after/before':>14}")
        for case in ("miss", "hit"):
            totals = {"before": 0.0, "after": 0.0}
            for phase in PHASES:
                b = stat(samples["before"][case][phase])
                a = stat(samples["after"][case][phase])
                totals["before"] += b
                totals["after"] += a
                print(f"{case:<6}{phase:<16}{b:>11.2f}{a:>10.2f}{a / b:>14.2f}")
            b, a = totals["before"], totals["after"]
            print(f"{case:<6}{'total':<16}{b:>11.2f}{a:>10.2f}{a / b:>14.2f}")
        print()


if __name__ == "__main__":
    main()
