"""Routing decisions per second and index memory per block (docs/routing.md "Cost").

One decision = the router's whole work for one request and one role: read the body's ids
(the intake's check that they are int32 ids, `PromptReader.prompt`, converts them once), hash
the prompt once (`Prompt.request_for`), compute the usable hit on every engine of the role
with kvcache's lookup over that engine's index, and let the cache-aware policy choose. Two
prompts:

* `fresh`: a prompt the router has never seen (its memo of prefix hash chains emptied before
  each decision, so every unit is hashed and the memo's bookkeeping is paid too);
* `shared`: the request shares all but its last 1,024 tokens with recent requests (a system
  prompt or a conversation's history): the memo (`kvcache.hashing.PrefixChains`) supplies the
  shared prefix's hashes, the rest is hashed fresh.

A request makes two decisions (prefill, then decode) on ONE hashed prompt (`Prompt` keeps it),
so a request's routing costs the hash once plus both roles' scoring. `hash-only ms` is the
baseline, interleaved with the decisions: converting and hashing the whole prompt without the
memo; `ratio` is a decision's time over it; `gc runs`, the cyclic garbage collector's runs
during the row's decisions (a router's index is long-lived: a collection in a decision would
be worth `gc.freeze()`). The request has
65,536 tokens; 8 engines each index 100,000 blocks (gpt-oss-like geometry: a full group with
the EAGLE draft and a sliding group, block 16), engine i holding the first i/8 of the prompt
in both groups (the rest of its blocks are other prefixes), so every engine's lookup does
real work. Prefill engines are scored with the prefill cap, decode engines with the
`per-group` plan's local reuse; a decode decision then applies conditional disaggregation's
rule on the chosen engine (`Routing.decide_path`: the hit bound there leaves a suffix of at
least 8,192 tokens, so the request goes through P). Goal: >= 1,000 decisions/s.

Converting, hashing and each role's holders pass (one pass over the prompt's keys in the map
of which engines hold each key) run in kvcache's optional C accelerator when it is built
(`relaykv.kvcache.accel`); `--no-accel` measures the pure-Python fallback a machine without a
compiler gets.

    python benchmarks/bench_router.py [--engines 8] [--blocks 100000] [--tokens 65536]
                                      [--no-accel]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import tracemalloc

from relaykv.kvcache import accel, preset
from relaykv.router.backends import BackendPool
from relaykv.router.holders import KeyHolders
from relaykv.router.index import EngineIndex
from relaykv.router.routing import Routing

SHARED_TAIL = 1024  # tokens a `shared` prompt does not share with the previous ones


def build_indexes(
    role: str, engines: int, blocks: int, prompt: list[int], holders: KeyHolders
) -> list[EngineIndex]:
    """`engines` indexes of `role` sharing the role's `holders` map."""
    geometry = preset("gpt-oss-like")
    rng = random.Random(0)
    indexes = []
    for i in range(engines):
        index = EngineIndex(geometry, role, "per-group", holders=holders)
        keys = [index.request(prompt).keys(g) for g in range(len(geometry.groups))]
        per_group = blocks // len(geometry.groups)
        for g, gmap in enumerate(index.maps):
            held = keys[g][: len(keys[g]) * i // engines]
            for key in held:
                gmap[key] = 1
            while len(gmap) < per_group:
                gmap[rng.randbytes(16)] = 1
            if index.slot is not None:
                holders.add(g, gmap, index.slot)
        indexes.append(index)
    return indexes


def memory_per_block(blocks: int, holders: bool) -> float:
    geometry = preset("gpt-oss-like")
    rng = random.Random(1)
    keys = [bytearray(rng.randbytes(16)) for _ in range(blocks)]
    gc.collect()
    tracemalloc.start()
    index = EngineIndex(geometry, "decode", holders=KeyHolders() if holders else None)
    for n, key in enumerate(keys):
        stored = bytes(key)  # keys arrive from the wire as new objects
        index.maps[n % 2][stored] = 1
        if index.holders is not None and index.slot is not None:
            index.holders.add(n % 2, [stored], index.slot)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return current / blocks


def decisions_per_s(
    role: str, args: argparse.Namespace, prompt: list[int], shared: bool
) -> tuple[float, float, float, int]:
    """(decisions/s, ms per decision, hash-only ms: medians; cyclic GC runs meanwhile)"""
    routing = Routing("cache-aware")
    holders = routing.holders if role == "decode" else routing.prefill_holders
    indexes = build_indexes(role, args.engines, args.blocks, prompt, holders)
    urls = [f"http://engine{i}" for i in range(args.engines)]
    pool = BackendPool(role, urls)
    for backend, index in zip(pool.backends, indexes, strict=True):
        tracker = routing.engines.tracker(backend)
        tracker.index = index
        tracker.subscriber = object()  # type: ignore[assignment]  # "following its events"
    times, hash_times = [], []
    collections = 0

    def count_collections(phase: str, info: dict[str, int]) -> None:
        nonlocal collections
        collections += phase == "start"

    gc.callbacks.append(count_collections)
    chosen = None
    rng = random.Random(3)
    head = prompt[: len(prompt) - SHARED_TAIL]
    for _ in range(args.repeat):
        if shared:  # a new tail each time; the head is in the memo after the first decision
            tokens = head + rng.choices(range(50_000), k=SHARED_TAIL)
        else:
            tokens = prompt
            routing.prompts.chains.clear()
        # Interleaved with the baseline (hashing the prompt alone), so both see the same load
        # on a shared machine.
        t0 = time.perf_counter()
        prompt_read = routing.prompts.prompt({"prompt": tokens})  # the intake's check
        choice = routing.pick(pool, set(), prompt_read)
        if role == "decode" and choice is not None:
            assert not routing.decide_path(choice).local  # a suffix of 8,192 tokens
        chosen = choice.backend if choice is not None else None
        t1 = time.perf_counter()
        req = indexes[0].request(prompt)
        req.keys(0), req.keys(1)
        t2 = time.perf_counter()
        times.append(t1 - t0)
        hash_times.append(t2 - t1)
    gc.callbacks.remove(count_collections)
    assert chosen is pool.backends[-1], "the engine holding the most of the prompt wins"
    median = statistics.median(times)
    return 1.0 / median, median * 1e3, statistics.median(hash_times) * 1e3, collections


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=100_000, help="indexed blocks per engine")
    parser.add_argument("--tokens", type=int, default=65_536)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument(
        "--no-accel", action="store_true", help="measure the pure-Python fallback"
    )
    args = parser.parse_args()
    if args.no_accel:
        accel.native = None
    prompt = random.Random(2).choices(range(50_000), k=args.tokens)
    print(
        f"{args.engines} engines x {args.blocks:,} indexed blocks, {args.tokens:,}-token "
        f"request, median of {args.repeat} (cpus: {os.cpu_count()})"
    )
    path = "C accelerator" if accel.native is not None else "pure Python (no accelerator)"
    print(f"load average {os.getloadavg()[0]:.1f}; kvcache hashing and holders pass: {path}")
    print(
        f"{'role':<9} {'prompt':<7} {'decisions/s':>12} {'ms/decision':>12} "
        f"{'hash-only ms':>13} {'ratio':>6} {'gc runs':>8}"
    )
    for shared in (False, True):
        for role in ("prefill", "decode"):
            rate, ms, base, collections = decisions_per_s(role, args, prompt, shared)
            kind = "shared" if shared else "fresh"
            print(
                f"{role:<9} {kind:<7} {rate:>12,.0f} {ms:>12.2f} {base:>13.2f} "
                f"{ms / base:>6.1f} {collections:>8}"
            )
    print(
        f"index memory per indexed block: {memory_per_block(200_000, True):.0f} bytes (a "
        "prefill or decode engine: its map and its role's shared holders entry, which a key "
        f"other engines of the role hold already costs nothing more); "
        f"{memory_per_block(200_000, False):.0f} bytes without the holders (colocated engine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
