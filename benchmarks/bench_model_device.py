"""Gemma-3-270M shapes on one device: prefill and decode throughput and their roofline.

    PYTHONPATH=src python benchmarks/bench_model.py --device cuda       # what gpu_check runs
    PYTHONPATH=src python benchmarks/bench_model.py --device cpu --prefill-lens 64 \\
        --decode-batches 1,2 --decode-tokens 4                          # the dry run

Random weights (deterministic) of Gemma-3-270M's real shapes (the config below is the
GGUF's: 18 layers, 5 sliding W=512 : 1 full, hidden 640, 4 query / 1 KV head of 256,
MLP 2048, vocabulary 262,144), so no checkpoint is needed on the device machine. Prefill:
one prompt per length, LM head on the last row only. Decode: `batch` requests of
`--decode-context` tokens each, `--decode-tokens` steps timed after their prefill.
Roofline: prefill FLOP/s against `--peak-tflops` (H200 bf16 dense: 989), decode bytes/s
(weights + LM head + KV read per step) against `--hbm-tbps` (H200: 4.8). Prints one JSON
line.
"""

from __future__ import annotations

import json
import time

import torch

from relaykv.model import ModelRunner, SequenceWork, StepBatch, from_hf_dict
from relaykv.model.presets import init_random_weights
from relaykv.model.transformer import empty_model

GEMMA3_270M = {
    "model_type": "gemma3_text",
    "vocab_size": 262144,
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _flops_per_token(config, context: int) -> float:
    """Matmul FLOPs of one token at `context`: projections, MLP, attention scores and values."""
    h, d = config.hidden_size, config.head_dim
    proj = (
        h * d * (2 * config.num_heads + 2 * config.num_kv_heads) + 3 * h * config.intermediate_size
    )
    attn = 0
    for i in range(config.num_layers):
        window = config.window_of(i)
        seen = min(context, window) if window else context
        attn += 4 * config.num_heads * d * seen
    return 2 * proj * config.num_layers + attn


def run(args) -> dict:
    device, dtype = args.device, getattr(torch, args.dtype)
    config = from_hf_dict(GEMMA3_270M)
    model = init_random_weights(empty_model(config, dtype, device), seed=0).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embed_bytes = model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    lens = [int(x) for x in args.prefill_lens.split(",")]
    batches = [int(x) for x in args.decode_batches.split(",")]
    longest = max([*lens, args.decode_context + args.decode_tokens + 1])
    per_seq = longest // 16 + 2
    probe = ModelRunner(model, num_blocks=2)
    groups = len(probe.layout.shapes)
    need = max(1, max(batches)) * groups * per_seq + 1
    del probe
    runner = ModelRunner(model, num_blocks=need)

    def tables(i: int) -> list[list[int]]:
        base = 1 + i * groups * per_seq
        return [list(range(base + g * per_seq, base + (g + 1) * per_seq)) for g in range(groups)]

    out: dict = {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "model": "gemma3-270m shapes, random weights",
        "prefill": {},
        "decode": {},
    }
    prompt = torch.randint(
        3, config.vocab_size, (longest,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    for n in lens:
        work = SequenceWork("p", prompt[:n], 0, tables(0), sample=True)
        runner.execute(StepBatch([work]))  # warm-up (kernels, allocator)
        _sync(device)
        started = time.perf_counter()
        runner.execute(StepBatch([work]))
        _sync(device)
        seconds = time.perf_counter() - started
        flops = sum(_flops_per_token(config, c + 1) for c in range(n))
        row = {"tok_s": n / seconds, "tflops": flops / seconds / 1e12}
        if args.peak_tflops:
            row["roofline"] = row["tflops"] / args.peak_tflops
        out["prefill"][str(n)] = row
    ctx = args.decode_context
    kv_bytes_per_token = sum(g.bytes_per_token for g in runner.layout.geometry.groups)
    for b in batches:
        seqs = [prompt[i : i + ctx] for i in range(b)]
        works = [SequenceWork(f"d{i}", s, 0, tables(i), sample=True) for i, s in enumerate(seqs)]
        first = runner.execute(StepBatch(works))
        last = [s.token_ids[0] for s in first.sequences]
        timed = 0.0
        for step in range(args.decode_tokens + 1):
            works = [
                SequenceWork(f"d{i}", [last[i]], ctx + step, tables(i), sample=True)
                for i in range(b)
            ]
            _sync(device)
            started = time.perf_counter()
            result = runner.execute(StepBatch(works))
            _sync(device)
            if step:  # the first step warms up this batch shape
                timed += time.perf_counter() - started
            last = [s.token_ids[0] for s in result.sequences]
        steps_s = args.decode_tokens / timed
        # Per step: every weight once (the embedding table is the LM head: read whole) and
        # each sequence's KV inside its windows.
        kv = b * sum(
            g.bytes_per_token * min(ctx, g.window or ctx) for g in runner.layout.geometry.groups
        )
        step_bytes = weight_bytes + kv
        row = {"tok_s": b * steps_s, "step_ms": 1000 / steps_s, "gb_s": step_bytes * steps_s / 1e9}
        if args.hbm_tbps:
            row["roofline"] = row["gb_s"] / (args.hbm_tbps * 1000)
        out["decode"][str(b)] = row
    out["weight_bytes"], out["embed_bytes"] = weight_bytes, embed_bytes
    out["kv_bytes_per_token"] = kv_bytes_per_token
    out["peak_tflops"], out["hbm_tbps"] = args.peak_tflops, args.hbm_tbps
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--device", default=None, help="cuda | cpu: the Gemma-3-270M-shape run")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prefill-lens", default="1024,8192,32768")
    parser.add_argument("--decode-batches", default="1,16,64")
    parser.add_argument("--decode-context", type=int, default=1024)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="0: no roofline")
    parser.add_argument("--hbm-tbps", type=float, default=4.8, help="0: no roofline")


def main(args) -> int:
    print(json.dumps(run(args)), flush=True)
    return 0
