"""Issue #10's acceptance figures: kill -9 under `relaykv up`, and SIGTERM under load.

For each scenario a fresh supervised cluster (2 prefill + 2 decode engines, tiny-hybrid,
shm transport) serves N requests at concurrency C (defaults 200 at 16); once a fraction of
them has completed, one member is killed with SIGKILL (one of the two prefill engines, then,
on another cluster, one of the two decode engines). Reported: requests that succeeded, the
errors of the rest, whether any hung (none may outlive --request-timeout), how long until
the member answered /health again, and whether any KV block or /dev/shm file leaked. The
SIGTERM scenario stops `relaykv up` with every request in flight and reports their statuses
and `up`'s exit status (every member exiting 0 is in its log).

    PYTHONPATH=src python benchmarks/chaos_acceptance.py [--requests 200] [--concurrency 16]

Prints a table and writes JSON (and a PNG of request outcomes) under --out (default
results/chaos/). docs/security.md quotes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.chaos.harness import UpCluster, run_load

ARGS = ["--num-prefill", "2", "--num-decode", "2", "--num-blocks", "600", "--max-model-len",
        "1024", "--kv-transfer-timeout", "5", "--prefill-timeout", "10"]


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, 256) for _ in range(96)]
    return [shared + [rng.randrange(1, 256) for _ in range(rng.randrange(8, 200))]
            for _ in range(n)]


async def kill_under_load(up: UpCluster, role: str, n: int, c: int, max_tokens: int) -> dict:
    victim = up.info[role][1]
    load = asyncio.ensure_future(run_load(up.router, prompts(n, 3), c, max_tokens=max_tokens,
                                          timeout=180))
    await asyncio.sleep(2.0)  # well into the run
    pid = up.kill(victim)
    killed = time.monotonic()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: up.wait_healthy(victim, 60, not_pid=pid))
    back_s = time.monotonic() - killed  # from SIGKILL to /health answering from a new process
    outcomes = await load
    await loop.run_in_executor(None, up.settled)
    return {
        "scenario": f"kill -9 one of two {role} engines", "requests": n, "concurrency": c,
        "succeeded": sum(o.status == 200 for o in outcomes),
        "errors": sorted({f"{o.status}: {o.error[:120]}" for o in outcomes if o.status != 200}),
        "slowest_s": round(max(o.seconds for o in outcomes), 2),
        "member_back_s": round(back_s, 2),
        "leaked_shm_files": up.leaked_shm(),
        "statuses": [o.status for o in outcomes],
    }


async def sigterm_under_load(up: UpCluster, c: int, max_tokens: int) -> dict:
    load = asyncio.ensure_future(run_load(up.router, prompts(c, 5), c, max_tokens=max_tokens,
                                          timeout=180))
    await asyncio.sleep(1.5)
    loop = asyncio.get_running_loop()
    code = await loop.run_in_executor(None, up.stop)
    outcomes = await load
    return {
        "scenario": "SIGTERM to relaykv up under load", "requests": c, "concurrency": c,
        "succeeded": sum(o.status == 200 for o in outcomes),
        "errors": sorted({f"{o.status}: {o.error[:120]}" for o in outcomes if o.status != 200}),
        "up_exit_status": code,
        "every_member_exited_0": "every member exited 0" in up.up_log(),
        "leaked_shm_files": up.leaked_shm(),
        "statuses": [o.status for o in outcomes],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", default="results/chaos")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []

    def fresh(name: str) -> UpCluster:
        for attempt in range(3):  # a free port taken by another process meanwhile: retry
            try:
                return UpCluster(ARGS, Path(tempfile.mkdtemp(prefix=f"chaos-{name}-"))).start()
            except RuntimeError as exc:
                print(f"[chaos] start {attempt + 1} failed: {str(exc)[-200:]}", flush=True)
        raise SystemExit("could not start a cluster")

    for role in ("prefill", "decode"):
        up = fresh(role)
        try:
            print(f"[chaos] kill -9 of a {role} engine under load ...", flush=True)
            results.append(asyncio.run(kill_under_load(up, role, args.requests,
                                                       args.concurrency, args.max_tokens)))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "statuses"}),
                  flush=True)
        finally:
            up.stop()
        (out / "chaos_acceptance.json").write_text(json.dumps(results, indent=1))
    up = fresh("sigterm")
    print("[chaos] SIGTERM under load ...", flush=True)
    results.append(asyncio.run(sigterm_under_load(up, args.concurrency, 48)))
    print(json.dumps({k: v for k, v in results[-1].items() if k != "statuses"}), flush=True)
    (out / "chaos_acceptance.json").write_text(json.dumps(results, indent=1))
    print(f"\n{'scenario':40} {'ok':>9} {'slowest s':>10} {'back s':>7}  leaks")
    for r in results:
        print(f"{r['scenario']:40} {r['succeeded']:>4}/{r['requests']:<4} "
              f"{r.get('slowest_s', '-')!s:>10} {r.get('member_back_s', '-')!s:>7}  "
              f"{r['leaked_shm_files'] or 'none'}")
        for error in r["errors"]:
            print(f"    {error}")
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3))
    for ax, r in zip(axes, results, strict=True):
        counts: dict[str, int] = {}
        for status in r["statuses"]:
            counts[str(status)] = counts.get(str(status), 0) + 1
        ax.bar(list(counts), list(counts.values()), color="tab:green")
        ax.set_title(r["scenario"], fontsize=8)
        ax.set_xlabel("HTTP status (-1: connection error)")
    axes[0].set_ylabel("requests")
    fig.tight_layout()
    fig.savefig(out / "chaos_acceptance.png", dpi=120)
    print(f"\nwrote {out / 'chaos_acceptance.json'} and {out / 'chaos_acceptance.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
