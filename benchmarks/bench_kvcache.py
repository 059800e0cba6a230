"""Cache-manager cost per request on a 65,536-token prompt (issue: the kvcache core).

Geometry gpt-oss-like (full b=16 with the EAGLE draft + sliding b=16 W=128). For a miss (a
new prompt) and a full hit (its identical resend) it times, per request: hashing, lookup,
allocation + caching (+ the sliding frees), and the final free. The same work runs on a
straightforward baseline (`kvcache_baseline.py`) in the same process; the ratio is the figure.
It also reports the pool's metadata overhead per block.

    .venv/bin/python benchmarks/bench_kvcache.py [--tokens 65536] [--repeat 15] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc
from array import array
from pathlib import Path

from kvcache_baseline import BaselineManager, hash_blocks
from tqdm import tqdm

from relaykv.kvcache import BlockPool, KVCacheManager, preset

PHASES = ("hash", "lookup", "allocate+cache", "free")


def time_relaykv(n: int, repeat: int, seed: int) -> dict[str, dict[str, float]]:
    geo = preset("gpt-oss-like")
    m = KVCacheManager(geo, 4 * (n // 16) + 64)
    rng = random.Random(seed)
    samples: dict[str, dict[str, list[float]]] = {
        c: {p: [] for p in PHASES} for c in ("miss", "hit")
    }
    for i in tqdm(range(repeat), desc="relaykv", leave=False):
        prompt = array("i", [rng.randrange(200_000) for _ in range(n)])
        for case in ("miss", "hit"):
            t0 = time.perf_counter()
            req = m.add_request(f"{case}{i}", prompt)
            t1 = time.perf_counter()
            hit = m._lookup(req)
            t2 = time.perf_counter()
            assert m._allocate(req, n, hit=hit)
            m._cache(req, n)
            m._free_skipped(req, n)
            t3 = time.perf_counter()
            m.release(req)
            t4 = time.perf_counter()
            assert (hit.tokens > 0) == (case == "hit")
            for phase, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                samples[case][phase].append(dt * 1e3)
    return {c: {p: statistics.median(v) for p, v in d.items()} for c, d in samples.items()}


def time_baseline(n: int, repeat: int, seed: int) -> dict[str, dict[str, float]]:
    b = 16
    m = BaselineManager(4 * (n // b) + 64, b, 128)
    rng = random.Random(seed)
    samples: dict[str, dict[str, list[float]]] = {
        c: {p: [] for p in PHASES} for c in ("miss", "hit")
    }
    for _ in tqdm(range(repeat), desc="baseline", leave=False):
        prompt = [rng.randrange(200_000) for _ in range(n)]
        for case in ("miss", "hit"):
            t0 = time.perf_counter()
            hashes = hash_blocks(prompt, b)
            t1 = time.perf_counter()
            hit, blocks = m.lookup(hashes, n)
            t2 = time.perf_counter()
            tables = [list(blocks[0]), list(blocks[1])]
            m.touch(tables[0] + tables[1])
            for table in tables:
                table.extend(m.allocate(-(-n // b) - len(table)))
            m.cache(tables, hashes)
            t3 = time.perf_counter()
            m.free(tables)
            t4 = time.perf_counter()
            assert (hit > 0) == (case == "hit")
            for phase, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                samples[case][phase].append(dt * 1e3)
    return {c: {p: statistics.median(v) for p, v in d.items()} for c, d in samples.items()}


def pool_bytes_per_block(num_blocks: int = 200_000) -> float:
    """Metadata bytes per block with every block cached and idle (the worst case)."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    pool = BlockPool(num_blocks, 2)
    blocks = pool.allocate(num_blocks - 1)
    pool.cache_blocks(0, ((blk, blk.to_bytes(16, "little")) for blk in blocks))
    pool.free(blocks)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return size / num_blocks


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, case in zip(axes, ("miss", "hit"), strict=True):
        bottom = {"relaykv": 0.0, "baseline": 0.0}
        for phase in PHASES:
            vals = [results[impl][case][phase] for impl in ("relaykv", "baseline")]
            ax.bar(["relaykv", "baseline"], vals, bottom=list(bottom.values()), label=phase)
            for impl, v in zip(("relaykv", "baseline"), vals, strict=True):
                bottom[impl] += v
        ax.set_title(f"{case}: {results['tokens']} tokens")
        ax.set_ylabel("ms per request")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/bench_kvcache"))
    args = parser.parse_args()
    results = {
        "tokens": args.tokens,
        "relaykv": time_relaykv(args.tokens, args.repeat, args.seed),
        "baseline": time_baseline(args.tokens, args.repeat, args.seed),
        "pool_bytes_per_block": pool_bytes_per_block(),
    }
    print(
        f"per request, {args.tokens}-token prompt, gpt-oss-like geometry, median of {args.repeat}"
    )
    print(f"{'case':<6}{'phase':<16}{'relaykv ms':>12}{'baseline ms':>13}{'speedup':>9}")
    for case in ("miss", "hit"):
        for phase in (*PHASES, "total"):
            ours = (
                sum(results["relaykv"][case].values())
                if phase == "total"
                else results["relaykv"][case][phase]
            )
            base = (
                sum(results["baseline"][case].values())
                if phase == "total"
                else results["baseline"][case][phase]
            )
            print(f"{case:<6}{phase:<16}{ours:>12.2f}{base:>13.2f}{base / ours:>8.1f}x")
    print(
        f"pool metadata: {results['pool_bytes_per_block']:.0f} bytes per block (all cached, idle)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "kvcache_cost.png")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'kvcache_cost.png'}")


if __name__ == "__main__":
    main()
