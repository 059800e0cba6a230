"""KV transfer throughput per transport, as a ratio to a plain memory copy of the same bytes.

Pages have a realistic size (default 16 tokens x 8 layers x 2 (K,V) x 8 heads x 64 dims x
2 bytes = 256 KiB). For each transfer size the baseline copies the same pages, page by
page, from one buffer into another in this process (numpy copy: a memcpy); then each
transport moves them from a serving endpoint (a separate process by default, as P and D
are) into this process's buffer, digests checked as always. The figure is transport
throughput / memcpy throughput, measured in the same run. Target: shm >= 0.5.

    PYTHONPATH=src python benchmarks/bench_transfer.py [--transports shm,tcp] [--pages 4,16,64,256]

Prints a table and writes a PNG (and JSON) under --out (default results/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tqdm import tqdm

from relaykv.transfer.transport import (
    PageCopy,
    PageLayout,
    TransportOptions,
    availability,
    get_transport,
)
from relaykv.transfer.transport.planes.shm import SharedKVBuffer
from relaykv.transfer.transport.serving.standalone import StandalonePeer, seeded_buffer

PAGE_BYTES = 16 * 8 * 2 * 8 * 64 * 2  # tokens x layers x (K,V) x kv heads x head dim x fp16


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--transports",
        default="shm,shm:direct,tcp,nixl,mooncake",
        help="comma-separated; shm:direct = shm with D's KV buffer in shared "
        "memory; unavailable ones are reported and skipped",
    )
    parser.add_argument("--pages", default="4,16,64,256", help="transfer sizes in pages")
    parser.add_argument("--page-bytes", type=int, default=PAGE_BYTES)
    parser.add_argument("--repeats", type=int, default=7, help="timed reads per size (median)")
    parser.add_argument(
        "--inproc", action="store_true", help="serve from this process instead of a separate one"
    )
    parser.add_argument("--out", default="results", help="folder for the PNG and JSON")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.pages.split(",")]
        if min(args.sizes) < 1 or args.repeats < 1 or args.page_bytes < 1:
            raise ValueError
    except ValueError:
        parser.error("--pages needs positive integers; --repeats and --page-bytes must be >= 1")
    return args


def memcpy_seconds(src: np.ndarray, dst: np.ndarray, pages: list[PageCopy], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for p in pages:
            np.copyto(dst[p.dst, : p.nbytes], src[p.src, : p.nbytes])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plan(layout: PageLayout, count: int, shift: int) -> list[PageCopy]:
    """`count` pages from scattered source blocks to scattered destination blocks."""
    rng = np.random.default_rng(count + shift)
    src = rng.choice(np.arange(1, layout.num_blocks), size=count, replace=False)
    dst = rng.choice(np.arange(1, layout.num_blocks), size=count, replace=False)
    size = layout.page_bytes[0]
    return [PageCopy(0, int(s), int(d), size) for s, d in zip(src, dst, strict=True)]


def bench_transport(
    name: str, layout: PageLayout, args: argparse.Namespace, src: np.ndarray, bar: tqdm
) -> dict[int, tuple[float, float]]:
    """pages -> (median read seconds, median memcpy seconds of the same pages)."""
    base_name, _, variant = name.partition(":")
    transport = get_transport(base_name)
    options = TransportOptions(timeout_s=120.0, staging_bytes=128 << 20)
    shared = SharedKVBuffer(layout) if variant == "direct" else None
    dst = shared.array if shared is not None else np.zeros_like(src)
    if args.inproc:
        server = transport.create_server(src, layout, engine_id="bench-P", options=options)
        descriptor, allow = (
            server.descriptor,
            (lambda rid, blocks: server.allow(rid, blocks, time.monotonic() + 600)),
        )
    else:
        server = StandalonePeer(base_name, layout, seed=0)
        descriptor, allow = (
            server.descriptor,
            (lambda rid, blocks: server.allow(rid, blocks, lease_s=600)),
        )
    client = transport.create_client(dst, layout, engine_id="bench-D", options=options)
    seconds: dict[int, tuple[float, float]] = {}
    base_dst = np.zeros_like(src)
    try:
        for count in args.sizes:
            pages = plan(layout, count, shift=1)
            blocks = {0: [p.src for p in pages]}
            times, copies = [], []
            for rep in range(args.repeats + 1):  # the first read warms connections up
                rid = f"{name}-{count}-{rep}"
                allow(rid, blocks)
                # the baseline runs interleaved with the reads: same pages, same moment
                copies.append(memcpy_seconds(src, base_dst, pages, 1))
                start = time.perf_counter()
                client.read(descriptor, rid, pages)
                if rep:
                    times.append(time.perf_counter() - start)
                bar.update(1)
            for p in pages:  # the benchmark must not time a broken transfer
                assert np.array_equal(dst[p.dst, : p.nbytes], src[p.src, : p.nbytes]), name
            seconds[count] = (statistics.median(times), statistics.median(copies[1:]))
    finally:
        client.close()
        server.close()
        if shared is not None:
            shared.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    num_blocks = 2 * max(args.sizes) + 2
    layout = PageLayout(num_blocks, args.page_bytes, (args.page_bytes,))
    src = seeded_buffer(layout, 0)  # what a standalone peer with seed 0 serves
    names = [n.strip() for n in args.transports.split(",") if n.strip()]
    usable = availability()
    for name in names:
        if name.partition(":")[0] not in usable or name.partition(":")[2] not in ("", "direct"):
            print(
                f"bench_transfer: error: --transports: unknown transport {name!r}", file=sys.stderr
            )
            return 2
    skipped = {
        n: usable[n.partition(":")[0]] for n in names if usable[n.partition(":")[0]] is not None
    }
    names = [n for n in names if n not in skipped]

    results: dict[str, dict[int, tuple[float, float]]] = {}
    total = len(names) * len(args.sizes) * (args.repeats + 1)
    with tqdm(total=total, desc="kv transfer", unit="read") as bar:
        for name in names:
            bar.set_postfix_str(name)
            results[name] = bench_transport(name, layout, args, src, bar)

    mode = "in-process" if args.inproc else "P in a separate process"
    print(
        f"\nKV transfer throughput ({mode}; page {args.page_bytes} B; median of "
        f"{args.repeats}; ratio = transport / memcpy of the same bytes)"
    )
    print("(each transport's memcpy baseline is timed interleaved with its own reads)")
    header = f"{'pages':>6} {'MiB':>7}" + "".join(
        f" {n + ' GB/s':>15} {'memcpy':>7} {'ratio':>6}" for n in names
    )
    print(header)
    rows = []
    for count in args.sizes:
        nbytes = count * args.page_bytes
        line = f"{count:>6} {nbytes / 2**20:>7.1f}"
        row: dict[str, float] = {"pages": count, "bytes": nbytes}
        for name in names:
            read_s, copy_s = results[name][count]
            rate, base = nbytes / read_s / 1e9, nbytes / copy_s / 1e9
            line += f" {rate:>15.2f} {base:>7.2f} {rate / base:>6.2f}"
            row[f"{name}_gbps"] = rate
            row[f"{name}_memcpy_gbps"] = base
            row[f"{name}_ratio"] = rate / base
        rows.append(row)
        print(line)
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        ax.plot(args.sizes, [r[f"{name}_ratio"] for r in rows], marker="o", label=name)
    ax.axhline(0.5, color="grey", linestyle="--", label="shm target (0.5)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"pages per transfer ({args.page_bytes // 1024} KiB each)")
    ax.set_ylabel("throughput / memcpy")
    ax.set_title(f"KV transfer vs memcpy ({mode})")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "bench_transfer.png", dpi=120)
    (out / "bench_transfer.json").write_text(
        json.dumps(
            {
                "mode": mode,
                "page_bytes": args.page_bytes,
                "repeats": args.repeats,
                "rows": rows,
                "skipped": skipped,
            },
            indent=2,
        )
    )
    print(f"wrote {out / 'bench_transfer.png'} and {out / 'bench_transfer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
