"""The KV tier's acceptance benchmark (issue 26, docs/tier.md "Measured").

    PYTHONPATH=src python benchmarks/bench_tier.py                 # the acceptance sizes
    PYTHONPATH=src python benchmarks/bench_tier.py --prefixes 6 --prefix-len 256 --blocks 150

Revisits: tiny-hybrid with its EAGLE draft (k=2) and a `--blocks`-block pool serves
`--prefixes` distinct `--prefix-len`-token prefixes, each once in order and then once more in
shuffled order (a new short suffix each time, so every revisit shares exactly the prefix),
one request at a time, greedy. Run twice: without a tier and with `--kv-offloading-size`.
Reported per run: the revisits' cached share (usage `cached_tokens` / prompt tokens), their
mean TTFT, and whether the greedy outputs of the two runs are identical. The acceptance:
with the tier cached share >= 0.7 and a lower mean TTFT, without <= 0.3, outputs identical.

Idle tier: the same engines serve `--idle-prompts` distinct prompts that nobody revisits
(the tier stores every checkpoint, loads nothing); the mean engine step time with and without
the tier, alternating runs `--idle-repeats` times in one process. Acceptance: <= 5% more.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from relaykv import model
from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.serve.assembly.tier_wiring import tier_blocks
from relaykv.transfer.tier.host import HostTier


def build(tiny, draft, blocks: int, tier_gib: float | None, max_len: int) -> LLMEngine:
    runner = model.ModelRunner(
        tiny.model, num_blocks=blocks, block_size=16, draft=draft, num_speculative_tokens=2
    )
    config = EngineConfig(
        num_blocks=blocks,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=max_len
        ),
    )
    tier = None
    if tier_gib is not None:
        capacity = tier_blocks(tier_gib, runner.geometry.block_bytes)
        tier = HostTier(runner.kv_buffer, capacity)
    return LLMEngine(runner, config, vocab_size=tiny.config.vocab_size, tier=tier)


def workload(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[1, *(rng.randrange(3, 259) for _ in range(length - 1))] for _ in range(count)]
    order = list(range(count))
    revisit = order[:]
    rng.shuffle(revisit)
    return [prefixes[p] + [rng.randrange(3, 259) for _ in range(8)] for p in order + revisit]


def serve(eng: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    """One request at a time; per request its outputs, cached tokens and TTFT."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    rows = []
    for i, prompt in enumerate(prompts):
        req = eng.add_request(f"r{i}", prompt, params)
        while eng.has_unfinished():
            steps = eng.metrics.num_steps
            eng.step()
            if eng.metrics.num_steps == steps:
                time.sleep(0.0005)  # a tier load in flight: yield, as the async engine does
        assert req.first_token_time is not None
        rows.append(
            {
                "output": req.output_ids,
                "cached": req.num_cached_tokens,
                "prompt": len(prompt),
                "ttft": req.first_token_time - req.arrival_time,
            }
        )
    return rows


def shutdown(eng: LLMEngine) -> None:
    if eng.manager.tier is not None:
        eng.manager.tier.shutdown()


def revisits(args, tiny, draft) -> dict:
    prompts = workload(args.prefixes, args.prefix_len, args.seed)
    max_len = args.prefix_len + 8 + args.max_tokens + 8
    out = {}
    for name, gib in (("without tier", None), ("with tier", args.kv_offloading_size)):
        eng = build(tiny, draft, args.blocks, gib, max_len)
        start = time.perf_counter()
        rows = serve(eng, prompts, args.max_tokens)
        wall = time.perf_counter() - start
        second = rows[args.prefixes :]
        out[name] = {
            "cached_share": sum(r["cached"] for r in second) / sum(r["prompt"] for r in second),
            "mean_ttft_s": statistics.mean(r["ttft"] for r in second),
            "wall_s": wall,
            "outputs": [r["output"] for r in rows],
        }
        if eng.manager.tier is not None:
            out[name]["tier"] = eng.manager.tier.stats.snapshot()
        shutdown(eng)
    same = out["without tier"]["outputs"] == out["with tier"]["outputs"]
    for run in out.values():
        del run["outputs"]
    out["outputs_identical"] = same
    return out


def idle(args, tiny, draft) -> dict:
    rng = random.Random(args.seed + 1)
    prompts = [
        [1, *(rng.randrange(3, 259) for _ in range(args.prefix_len - 1))]
        for _ in range(args.idle_prompts)
    ]
    max_len = args.prefix_len + args.max_tokens + 8
    times: dict[str, list[float]] = {"without tier": [], "with tier": []}
    runs = (("without tier", None), ("with tier", args.kv_offloading_size))
    for repeat in range(args.idle_repeats):
        for name, gib in runs if repeat % 2 == 0 else runs[::-1]:
            eng = build(tiny, draft, args.blocks, gib, max_len)
            serve(eng, prompts[:1], args.max_tokens)  # warm-up
            steps = eng.metrics.num_steps
            start = time.perf_counter()
            serve(eng, prompts, args.max_tokens)
            elapsed = time.perf_counter() - start
            times[name].append(elapsed / (eng.metrics.num_steps - steps))
            shutdown(eng)
    base = statistics.median(times["without tier"])
    tier = statistics.median(times["with tier"])
    return {
        "step_ms_without": base * 1e3,
        "step_ms_with": tier * 1e3,
        "overhead": tier / base - 1,
        "runs": {k: [t * 1e3 for t in v] for k, v in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefixes", type=int, default=24)
    parser.add_argument("--prefix-len", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=600, help="device pool blocks")
    parser.add_argument("--kv-offloading-size", type=float, default=0.5, metavar="GIB")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--idle-prompts", type=int, default=8)
    parser.add_argument("--idle-repeats", type=int, default=3)
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--skip-revisits", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tiny = model.load_model("tiny-hybrid")
    draft = model.default_draft("tiny-hybrid", tiny.config)
    warm = build(tiny, draft, args.blocks, None, args.prefix_len + 64)
    serve(warm, workload(2, args.prefix_len, args.seed + 2), args.max_tokens)  # first calls
    result = {}
    if not args.skip_revisits:
        result["revisits"] = rev = revisits(args, tiny, draft)
        print(f"{'run':<14}{'cached share':>14}{'mean TTFT ms':>14}{'wall s':>9}")
        for name in ("without tier", "with tier"):
            r = rev[name]
            print(
                f"{name:<14}{r['cached_share']:>14.3f}{r['mean_ttft_s'] * 1e3:>14.1f}"
                f"{r['wall_s']:>9.1f}"
            )
        print(f"greedy outputs identical: {rev['outputs_identical']}")
    if not args.skip_idle:
        result["idle"] = idle(args, tiny, draft)
        i = result["idle"]
        print(
            f"idle tier: step {i['step_ms_without']:.2f} ms without, "
            f"{i['step_ms_with']:.2f} ms with ({i['overhead'] * 100:+.1f}%)"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
