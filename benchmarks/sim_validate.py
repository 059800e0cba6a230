"""Predicted vs measured: `relaykv sim` against a real `relaykv up` + `relaykv bench serve`.

For each workload: a real local P/D cluster (tiny-hybrid with its EAGLE draft, shm), warmed
up by four requests of unrelated prompts, runs `bench serve` while the engines' counters are
read before and after; then the simulator,
with a calibration file of this machine (`relaykv sim calibrate`, made first unless
`--hardware FILE` is given), predicts the same run. Prints predicted vs measured mean
TTFT, mean TPOT, output throughput and D's local hit tokens, with the relative error
(docs/simulator.md "Validation"). The calibration's steps are not these runs.

    .venv/bin/python benchmarks/sim_validate.py [--hardware FILE] [--output-dir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relaykv.bench.ab.cluster import ClusterProcess
from relaykv.bench.engine_counters import counter_deltas, scrape_counters
from relaykv.cli import main as relaykv

METRICS = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput", "d_local_hit_tokens")
WORKLOADS = {
    "gsp 3x4 1024+32 out32 c4": [
        "--dataset-name",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "3",
        "--gsp-prompts-per-group",
        "4",
        "--gsp-system-prompt-len",
        "1024",
        "--gsp-question-len",
        "32",
        "--gsp-output-len",
        "32",
        "--max-concurrency",
        "4",
    ],
    "gsp 4x6 2048+64 out64 c4": [
        "--dataset-name",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "4",
        "--gsp-prompts-per-group",
        "6",
        "--gsp-system-prompt-len",
        "2048",
        "--gsp-question-len",
        "64",
        "--gsp-output-len",
        "64",
        "--max-concurrency",
        "4",
    ],
    "prefix_repetition 2048+64 out16 c2": [
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        "2048",
        "--prefix-repetition-suffix-len",
        "64",
        "--prefix-repetition-num-prefixes",
        "2",
        "--prefix-repetition-output-len",
        "16",
        "--num-prompts",
        "16",
        "--max-concurrency",
        "2",
    ],
}
QUICK = {
    "gsp 2x4 512+16 out16 c4": [
        "--dataset-name",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "2",
        "--gsp-prompts-per-group",
        "4",
        "--gsp-system-prompt-len",
        "512",
        "--gsp-question-len",
        "16",
        "--gsp-output-len",
        "16",
        "--max-concurrency",
        "4",
    ]
}

# The warm-up requests: random token ids of another seed than any workload's, so they share
# no prefix with them (the workloads' counters start after them), four at once so that P
# also runs a batch of prompts once (the kernels' first run of that shape).
WARMUP = [
    "--ignore-eos",
    "--disable-tqdm",
    "--temperature",
    "0",
    "--dataset-name",
    "random",
    "--random-input-len",
    "528",
    "--random-output-len",
    "16",
    "--num-prompts",
    "4",
    "--max-concurrency",
    "4",
    "--seed",
    "8",
]


def engine_flags(k: int, blocks: int, max_len: int, torch_threads: int | None = None) -> list[str]:
    """Flags both `relaykv up` and `relaykv sim` take; `torch_threads` None: up's default.
    The router's rule is spelled out: `relaykv up`'s router defaults to conditional
    disaggregation with a 512-token max suffix, `relaykv sim` to `always` (and a max suffix
    from the presets' cost estimate), and the two must run the same rule."""
    flags = ["--speculative-tokens", str(k), "--num-blocks", str(blocks)]
    flags += ["--max-model-len", str(max_len)]
    flags += ["--disaggregation", "conditional", "--conditional-max-suffix", "512"]
    if torch_threads is not None:
        flags += ["--torch-threads", str(torch_threads)]
    return flags


def real_run(
    workload: list[str], flags: list[str], policy: str, out: Path, seeds: Sequence[int] = (0,)
) -> dict[str, Any]:
    """One `relaykv up` cluster, one `bench serve` run of `workload` per seed (`--seed`: other
    prompts each round), the rounds pooled (`pooled`) with the engines' counter deltas."""
    up = [sys.executable, "-m", "relaykv", "up", "--json", "--pd-policy", policy, *flags]
    up += ["--log-dir", str(out / "up-logs")]  # the members' logs, next to the run's results
    rounds = []
    with ClusterProcess(up, out / "up.log") as cluster:
        urls = cluster.urls
        assert urls is not None
        # Requests of unrelated prompts first, outside the counters: the first steps of
        # a fresh engine pay first-touch costs (pool pages, the kernels' first run of each
        # shape: a cold P computed its first 528-token prompt 2.6x slower than a warm one)
        # that the simulator, like the calibration (which warms its cluster the same way),
        # does not model. vLLM's engines warm up at start; the seed's runs had one warmup.
        code = relaykv(["bench", "serve", "--base-url", urls.router, *WARMUP])
        if code != 0:
            raise RuntimeError(f"the warm-up requests failed ({code})")
        before = {r: asyncio.run(scrape_counters(getattr(urls, r))) for r in ("prefill", "decode")}
        for seed in seeds:
            name = f"real-seed{seed}.json"
            code = relaykv(
                [
                    "bench",
                    "serve",
                    "--base-url",
                    urls.router,
                    "--ignore-eos",
                    "--disable-tqdm",
                    "--save-result",
                    "--result-dir",
                    str(out),
                    "--result-filename",
                    name,
                    # Greedy: the simulator's acceptance rate is the draft's on greedy decoding
                    # (the server's default, temperature 1, accepts far fewer drafts).
                    "--temperature",
                    "0",
                    *workload,
                    "--seed",
                    str(seed),
                ]
            )
            if code != 0:
                raise RuntimeError(f"bench serve failed ({code})")
            rounds.append(json.loads((out / name).read_text()))
        after = {r: asyncio.run(scrape_counters(getattr(urls, r))) for r in ("prefill", "decode")}
    result = pooled(rounds)
    delta = {r: counter_deltas(before[r], after[r]) for r in before}
    result["d_local_hit_tokens"] = delta["decode"]["local_hit_tokens"] or 0
    result["d_external_hit_tokens"] = delta["decode"]["external_hit_tokens"] or 0
    result["p_local_hit_tokens"] = delta["prefill"]["local_hit_tokens"] or 0
    result["d_kv_bytes_received"] = delta["decode"]["kv_bytes_received"] or 0
    return result


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one workload as one run: mean TTFT and TPOT over all their requests, output
    throughput as all their output tokens over all their durations, the counters summed
    (keys other rounds lack are dropped). One round is itself."""
    if len(rounds) == 1:
        return dict(rounds[0])
    requests = sum(r["completed"] for r in rounds)
    out: dict[str, Any] = {"rounds": len(rounds), "completed": requests}
    for key in ("mean_ttft_ms", "mean_tpot_ms"):
        out[key] = sum(r[key] * r["completed"] for r in rounds) / requests
    out["duration"] = sum(r["duration"] for r in rounds)
    out["total_output_tokens"] = sum(r["total_output_tokens"] for r in rounds)
    out["output_throughput"] = out["total_output_tokens"] / out["duration"]
    for key in ("d_local_hit_tokens", "d_external_hit_tokens", "p_local_hit_tokens"):
        if all(key in r for r in rounds):
            out[key] = sum(r[key] for r in rounds)
    return out


def sim_run(
    workload: list[str], flags: list[str], policy: str, hardware: str, seeds: Sequence[int] = (0,)
) -> dict[str, Any]:
    """The simulator's run of `workload` per seed, each on a fresh cluster (the real rounds
    share one, but their prompts share nothing), pooled as the real rounds are."""
    return pooled(
        [_sim_round([*workload, "--seed", str(s)], flags, policy, hardware) for s in seeds]
    )


def _sim_round(workload: list[str], flags: list[str], policy: str, hardware: str) -> dict[str, Any]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = relaykv(
            [
                "sim",
                "--model",
                "tiny-hybrid",
                "--hardware",
                hardware,
                "--pd-policy",
                policy,
                "--json",
                *flags,
                *workload,
            ]
        )
    if code != 0:
        raise RuntimeError(f"relaykv sim failed ({code})")
    return json.loads(buf.getvalue().strip().splitlines()[-1])[0]


def compare(
    workload: list[str],
    hardware: str,
    out: Path,
    policy: str = "per-group",
    k: int = 2,
    blocks: int = 3000,
    max_len: int = 4096,
    torch_threads: int | None = None,
    seeds: Sequence[int] = (0,),
) -> dict[str, Any]:
    """One workload measured and simulated under the same conditions (k with the shipped
    draft, `torch_threads` per engine: None is `relaykv up`'s default); the calibration
    `hardware` must have been made under them, or `relaykv sim` refuses it. `seeds`: one
    round of the workload per seed, pooled (a run of a few seconds is at the mercy of the
    machine's speed in those seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    flags = engine_flags(k, blocks, max_len, torch_threads)
    real = real_run(workload, flags, policy, out, seeds)
    sim = sim_run(workload, flags, policy, hardware, seeds)
    rows = {}
    for key in METRICS:
        measured, predicted = float(real[key]), float(sim[key])
        rows[key] = {
            "measured": measured,
            "predicted": predicted,
            "error": predicted / measured - 1 if measured else 0.0,
        }
    return {"rows": rows, "real": real, "sim": sim}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| workload | metric | measured | predicted | error |", "|---|---|---|---|---|"]
    for name, res in results.items():
        for key, row in res["rows"].items():
            lines.append(
                f"| {name} | {key} | {row['measured']:.1f} | {row['predicted']:.1f} | "
                f"{100 * row['error']:+.1f}% |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default=None, help="a calibration file (default: make one)")
    parser.add_argument("--output-dir", default="results/sim_validate")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--speculative-tokens", type=int, default=2, help="k (default 2)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="per engine, in calibration, the real runs and the simulation (default 1: on a "
        "shared machine OpenMP's threads turn other processes' load into slowdowns)",
    )
    opts = parser.parse_args()
    k, threads = opts.speculative_tokens, opts.torch_threads
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    hardware = opts.hardware
    if hardware is None:
        hardware = str(out / "calibration.json")
        relaykv(
            [
                "sim",
                "calibrate",
                "--model",
                "tiny-hybrid",
                "--speculative-tokens",
                str(k),
                "--torch-threads",
                str(threads),
                "--out",
                hardware,
            ]
        )
    results = {}
    for i, (name, workload) in enumerate((QUICK if opts.quick else WORKLOADS).items()):
        results[name] = compare(workload, hardware, out / f"w{i}", k=k, torch_threads=threads)
        print(markdown({name: results[name]}), flush=True)
    (out / "validation.json").write_text(json.dumps(results, indent=1, default=str))
    table = markdown(results)
    (out / "validation.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
