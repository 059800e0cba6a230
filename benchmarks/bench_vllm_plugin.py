"""What relaykv.vllm costs vLLM 0.33's scheduler per step (issue 24: at most 10 %).

One run, with and without the plugin, on the cache probe's workload (relaykv/vllm/probe.py:
a colocated engine, then a prefill and a decode engine through the first load, resend,
extension and sibling): per step, the time inside vLLM's `Scheduler.schedule()` plus
`update_from_output()` (the stand-in worker's own work is outside). "Stock" is vLLM's own
Scheduler with NixlConnector; "plugin" is relaykv.vllm.Scheduler with RelayKVConnector under
`per-group`, whose manager also hashes each prompt with relaykv's own keys. Both variants
alternate per round so load drift hits both. Runs in the vLLM venv:

    .venv-vllm/bin/python benchmarks/bench_vllm_plugin.py [--prompt-len 8192] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from relaykv.cache_probe.probe import FOLLOW_UPS, ProbePrompts, pool_blocks
from relaykv.kvcache.geometry import preset
from relaykv.vllm import probe

VARIANTS = {"stock": ("legacy", True), "plugin": ("per-group", False)}


def one_round(geometry, policy: str, stock: bool, n: int, seed: int, dirs) -> tuple[float, int]:
    """Scheduler seconds and steps of one probe (colocated + P/D) on fresh engines."""
    prompts = ProbePrompts.make(n, 48, 24, seed)
    options = {"pd_policy": policy, "retention": "boundaries"}
    blocks, max_len = pool_blocks(geometry, prompts), len(prompts.extension) + 64
    workers = {
        name: probe.StandInWorker(
            probe.build_scheduler(
                probe.EngineSpec(geometry, options, role, name, blocks, max_len, stock), dirs
            )
        )
        for role, name in ((None, "C"), ("kv_producer", "P"), ("kv_consumer", "D"))
    }
    c, p, d = workers["C"], workers["P"], workers["D"]
    u = geometry.hash_unit
    for i, name in enumerate(("first", *FOLLOW_UPS)):
        prompt = getattr(prompts, name)
        c.scheduler.add_request(probe._request(f"C-{i}", prompt, None, u))
        probe._run_to_end(c, f"C-{i}")
        p.scheduler.add_request(probe._request(f"P-{i}", prompt, {"do_remote_decode": True}, u))
        params = probe._run_to_end(p, f"P-{i}")
        d.scheduler.add_request(probe._request(f"D-{i}", prompt, dict(params or {}), u))
        d.step()
        p.step(finished_sending=[f"P-{i}"])
        probe._run_to_end(d, f"D-{i}")
    seconds = sum(w.scheduler_seconds for w in workers.values())
    return seconds, sum(w.steps for w in workers.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt-len", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--presets", default="gpt-oss-like,dsv4-like")
    args = parser.parse_args()
    report = {}
    with probe.model_dirs() as dirs:
        for name in args.presets.split(","):
            geometry = preset(name)
            per_step: dict[str, list[float]] = {v: [] for v in VARIANTS}
            one_round(geometry, "per-group", False, args.prompt_len, 0, dirs)  # warm up
            one_round(geometry, "legacy", True, args.prompt_len, 0, dirs)
            for r in range(args.rounds):
                for variant, (policy, stock) in VARIANTS.items():
                    seconds, steps = one_round(geometry, policy, stock, args.prompt_len, r, dirs)
                    per_step[variant].append(seconds / steps * 1e6)
            stock_us = statistics.median(per_step["stock"])
            plugin_us = statistics.median(per_step["plugin"])
            report[name] = {
                "stock_us_per_step": round(stock_us, 1),
                "plugin_us_per_step": round(plugin_us, 1),
                "overhead_pct": round(100 * (plugin_us / stock_us - 1), 1),
            }
            print(name, json.dumps(report[name]), flush=True)
    print(json.dumps({"prompt_len": args.prompt_len, "rounds": args.rounds, **report}))


if __name__ == "__main__":
    main()
