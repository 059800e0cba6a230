"""The simulator's own speed: simulated requests per wall second (docs/simulator.md "Speed").

Scenarios (each runs `relaykv sim` in this process, every listed policy on a fresh cluster):
* `c8-output128`: gpt-oss-20b + EAGLE3 on H20 TP2/TP2 over RDMA, prefix_repetition 65,504 +
  64, 8 warmups + 40 requests at c8, 128 output tokens (48 requests of 65k tokens per
  policy), all four policies (target: under 2 minutes of wall time);
* `stress`: dsv4-flash on H20 TP8/TP8, 64k generated-shared-prefix, 320 requests x 1,500
  output tokens at c64, all four policies (target: under 3 minutes);
* `scale` (only with `--scale`): 16 P + 16 D engines of gpt-oss-20b on H100 TP1, 10,000
  generated-shared-prefix requests (100 groups x 100, 4,096 + 128 tokens, 256 output) at
  100 requests/s, `per-group` (target: under 10 minutes).
Reports wall and CPU seconds (this machine is shared: CPU time is the stable figure),
simulated requests per wall second, and simulated seconds per wall second.

    .venv/bin/python benchmarks/bench_sim.py [--scale] [--only NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import time

from sim_seed_tables import PR, SETUPS, STRESS  # the upstream report's scenarios

from relaykv.cli import main as relaykv

SCALE = shlex.split(
    "--model gpt-oss-20b --hardware h100 --num-prefill 16 --num-decode 16 --link rdma "
    "--speculative-tokens 3 --dataset-name generated-shared-prefix --gsp-num-groups 100 "
    "--gsp-prompts-per-group 100 --gsp-system-prompt-len 4096 --gsp-question-len 128 "
    "--gsp-output-len 256 --request-rate 100 --max-concurrency 1024 --pd-policy per-group"
)
C8 = ["--max-concurrency", "8", "--num-prompts", "40", "--prefix-repetition-output-len", "128"]
SCENARIOS: dict[str, tuple[list[str], float]] = {
    # 8 warmups + 40 requests: the 48 requests of 65k tokens per policy the issue names.
    "c8-output128": (
        [*SETUPS["gpt-oss"], *PR, *C8, "--num-warmups", "8", "--pd-policy", "all"],
        120.0,
    ),
    "stress": ([*SETUPS["dsv4"], *STRESS, "--pd-policy", "all"], 180.0),
    "scale": (SCALE, 600.0),
}


def run(name: str) -> dict:
    argv, target = SCENARIOS[name]
    buf = io.StringIO()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(buf):
        code = relaykv(["sim", *argv, "--json", "--disable-tqdm"])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if code != 0:
        raise SystemExit(f"{name}: relaykv sim exited {code}")
    results = json.loads(buf.getvalue().strip().splitlines()[-1])
    requests = sum(r["completed"] + r["failed"] for r in results)
    simulated = sum(r["duration"] for r in results)
    return {
        "scenario": name,
        "policies": len(results),
        "requests": requests,
        "wall_s": wall,
        "cpu_s": cpu,
        "target_s": target,
        "requests_per_wall_s": requests / wall,
        "simulated_s_per_wall_s": simulated / wall,
        "per_policy_wall_s": {r["pd_policy"]: round(r["sim_wall_seconds"], 2) for r in results},
        "d_local_hit_share": {r["pd_policy"]: round(r["d_local_hit_share"], 4) for r in results},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", action="store_true", help="also the 16P+16D, 10k-request run")
    parser.add_argument("--only", choices=list(SCENARIOS), default=None)
    opts = parser.parse_args()
    names = [opts.only] if opts.only else [n for n in SCENARIOS if n != "scale" or opts.scale]
    print(
        "| scenario | policies | requests | wall s | CPU s | target s | requests/wall s |"
        " simulated s / wall s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        r = run(name)
        print(json.dumps(r), file=sys.stderr, flush=True)
        print(
            f"| {name} | {r['policies']} | {r['requests']} | {r['wall_s']:.1f} | "
            f"{r['cpu_s']:.1f} | {r['target_s']:.0f} | {r['requests_per_wall_s']:.2f} | "
            f"{r['simulated_s_per_wall_s']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
