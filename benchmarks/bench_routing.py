"""Cache-aware vs least-loaded routing on a local P/D cluster (docs/routing.md).

For each routing mode and cluster shape: `relaykv up` (tiny-hybrid with its EAGLE draft), a
shuffled generated-shared-prefix run through `relaykv bench serve`, then each engine's
`/metrics` and the router's `/routing`. Prints one table row per run: prefix-cache hit share
summed over prefill engines and over decode engines, TTFT, throughput, KV bytes moved, and the
largest share of requests any decode engine got.

    python benchmarks/bench_routing.py --shapes 2x2,2x4 --modes cache-aware,least-loaded
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

COUNTERS = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "relaykv:kv_bytes_received")


def scrape(url: str) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        for name in COUNTERS:
            if line.startswith(name) and not line.startswith("#"):
                head = line.split(" ")[0]
                if head.split("{")[0] in (name, name + "_total"):
                    out[name] += float(line.rsplit(" ", 1)[1])
    return out


def losses(records: list[dict]) -> dict[str, list[int]]:
    """Where one role's hits went, from the router's per-request records in arrival order:
    each request is classed by what its prefix's earlier requests did, `[requests, of which
    hit]` per class. `first`: no earlier request with this prefix (nothing to hit anywhere);
    `elsewhere`: earlier ones, none on the engine chosen (a routing loss); `after_1`: one
    earlier on that engine (under `boundaries` retention its windows sit at its own replay
    boundaries, so no hit, docs/design.md §6); `after_2+`: two or more (a miss here is a
    sibling still in flight or an eviction). A hit is the engine's own report (prefill) or,
    where the router has none (decode), the usable hit it scored."""
    seen: dict[str, list[str]] = {}
    out: dict[str, list[int]] = {k: [0, 0] for k in ("first", "elsewhere", "after_1", "after_2+")}
    for r in records:
        earlier = seen.setdefault(r["prefix"], [])
        here = earlier.count(r["engine"])
        cls = "first" if not earlier else "elsewhere" if not here else (
            "after_1" if here == 1 else "after_2+")
        out[cls][0] += 1
        hit = r["cached_tokens"] if r.get("cached_tokens") is not None else r["scored_hit"]
        out[cls][1] += int(hit > 0)
        earlier.append(r["engine"])
    return out


def start_cluster(shape: str, mode: str, log_dir: Path, extra: list[str]) -> tuple:
    p, d = shape.split("x")
    cmd = [
        sys.executable,
        "-m",
        "relaykv",
        "up",
        "--num-prefill",
        p,
        "--num-decode",
        d,
        "--routing",
        mode,
        "--json",
        "--log-dir",
        str(log_dir),
        *extra,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"relaykv up failed; logs in {log_dir}")
    return proc, json.loads(line)


def run(shape: str, mode: str, args: argparse.Namespace, work: Path) -> dict[str, object]:
    log_dir = work / f"{shape}-{mode}"
    extra = ["--speculative-tokens", "2", *args.engine_args.split()]
    proc, info = start_cluster(shape, mode, log_dir, extra)
    try:
        time.sleep(3)  # the router's first health tick subscribes to the events
        result = work / f"{shape}-{mode}.json"
        bench = [
            sys.executable,
            "-m",
            "relaykv",
            "bench",
            "serve",
            "--base-url",
            info["router"],
            "--dataset-name",
            "generated-shared-prefix",
            "--gsp-num-groups",
            str(args.groups),
            "--gsp-prompts-per-group",
            str(args.prompts),
            "--gsp-system-prompt-len",
            str(args.system_len),
            "--gsp-output-len",
            str(args.output_len),
            "--max-concurrency",
            str(args.concurrency),
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            str(work),
            "--result-filename",
            result.name,
            "--temperature",
            "0",
        ]
        subprocess.run(bench, check=True, stdout=subprocess.DEVNULL)
        bench_result = json.loads(result.read_text())
        share = {}
        kv_bytes = 0.0
        for role in ("prefill", "decode"):
            stats = [scrape(u) for u in info[role]]
            hits = sum(s["vllm:prefix_cache_hits"] for s in stats)
            queries = sum(s["vllm:prefix_cache_queries"] for s in stats)
            share[role] = hits / queries if queries else 0.0
            kv_bytes += sum(s["relaykv:kv_bytes_received"] for s in stats)
        routing = httpx.get(f"{info['router']}/routing?recent=1", timeout=10).json()
        decisions = [routing["engines"][u]["decisions"] for u in info["decode"]]
        records = routing.get("recent", [])
        return {
            "shape": shape,
            "mode": mode,
            "prefill_hit_share": round(share["prefill"], 3),
            "decode_hit_share": round(share["decode"], 3),
            "mean_ttft_ms": round(bench_result["mean_ttft_ms"], 1),
            "output_tok_s": round(bench_result["output_throughput"], 1),
            "total_tok_s": round(bench_result["total_token_throughput"], 1),
            "kv_mib_received": round(kv_bytes / 2**20, 1),
            "decode_decisions": decisions,
            "peak_load_ratio": routing.get("peak_load_ratio", {}),
            "prefix_waits": routing.get("prefix_waits", 0),
            "prefill_losses": losses([d for d in records if d["role"] == "prefill"]),
            "decode_losses": losses([d for d in records if d["role"] == "decode"]),
            "requests": records,
        }
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x2")
    parser.add_argument("--modes", default="cache-aware,least-loaded")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--system-len", type=int, default=2048)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--engine-args", default="", help="more `relaykv serve` flags, e.g. "
                        "'--retention dense'")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    rows = []
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            row = run(shape, mode, args, work)
            print(json.dumps({k: v for k, v in row.items() if k != "requests"}),
                  flush=True)
            rows.append(row)
    print(
        "\n| cluster | routing | prefill hit share | decode hit share | mean TTFT ms | "
        "output tok/s | total tok/s | KV MiB received | decode requests per engine |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['shape']} | {r['mode']} | {r['prefill_hit_share']} | {r['decode_hit_share']} "
            f"| {r['mean_ttft_ms']} | {r['output_tok_s']} | {r['total_tok_s']} | "
            f"{r['kv_mib_received']} | {r['decode_decisions']} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
