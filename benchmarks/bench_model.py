"""Model runner throughput against transformers on the same weights, in the same process.

    PYTHONPATH=src python benchmarks/bench_model.py          # tiny-hybrid + Gemma-3-270M
    PYTHONPATH=src python benchmarks/bench_model.py --models tiny-hybrid --decode-tokens 32

Rows (tokens per second, higher is better; ratio = relaykv / transformers):
* prefill: one prompt of `--prompt-len` tokens, LM head on the last position only on both
  sides (transformers `logits_to_keep=1`), KV written on both sides;
* decode b1: one request, `--decode-tokens` greedy steps after its prefill;
* decode b16: `--batch` requests decoding together (relaykv) against transformers
  `generate` serving them one after another, the way a server without paging or request
  batching does (the target: >= 3x); `generate` on a padded batch is shown as well.
Decode times exclude prefill: transformers' decode time is generate(n + 1) - generate(1).
Before timing, the transformers model must reproduce our logits (same weights, same math).
Writes a table to stdout, a PNG (`--out`) and the numbers as JSON next to it.

`--device cuda|cpu` runs `bench_model_device.py` instead: Gemma-3-270M shapes with random
weights on that device, prefill at 1k/8k/32k and decode at batch 1/16/64 with their
roofline ratios, printed as one JSON line (what `tools/gpu_check.sh` runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from relaykv.model import ModelRunner, SequenceWork, StepBatch, is_installed, load_model
from relaykv.model.loading.export import save_hf_dir


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=gen).tolist()


class Ours:
    def __init__(self, model, max_len: int, batch: int) -> None:
        blocks = 2 + 2 * batch * (max_len // 16 + 2)
        self.runner = ModelRunner(model, num_blocks=blocks)
        self.b = self.runner.layout.block_size
        self.groups = len(self.runner.layout.shapes)
        self.max_len = max_len

    def _tables(self, i: int) -> list[list[int]]:
        per = self.max_len // self.b + 2
        base = 1 + i * self.groups * per
        return [list(range(base + g * per, base + (g + 1) * per)) for g in range(self.groups)]

    def prefill(self, prompts: list[list[int]]) -> list[int]:
        works = [
            SequenceWork(f"r{i}", p, 0, self._tables(i), sample=True) for i, p in enumerate(prompts)
        ]
        out = self.runner.execute(StepBatch(works))
        return [s.token_ids[0] for s in out.sequences]

    def decode(self, prompts: list[list[int]], first: list[int], steps: int) -> list[list[int]]:
        seqs = [[*p, t] for p, t in zip(prompts, first, strict=True)]
        tables = [self._tables(i) for i in range(len(prompts))]
        for _ in range(steps):
            works = [
                SequenceWork(f"r{i}", [s[-1]], len(s) - 1, tables[i], sample=True)
                for i, s in enumerate(seqs)
            ]
            for s, out in zip(seqs, self.runner.execute(StepBatch(works)).sequences, strict=True):
                s.extend(out.token_ids)
        return [s[len(p) :] for s, p in zip(seqs, prompts, strict=True)]


def _hf_model(loaded, workdir: Path):
    import transformers

    path = save_hf_dir(loaded.model, workdir / loaded.name)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=loaded.model.dtype, attn_implementation="sdpa"
    ).eval()


def _check_same_model(loaded, hf, vocab: int) -> float:
    prompt = _prompts(1, 40, vocab, seed=99)[0]
    ours = Ours(loaded.model, 64, 1)
    tables = ours._tables(0)
    mine = ours.runner.score(StepBatch([SequenceWork("c", prompt, 0, tables)]))[0]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    diff = float((mine - ref).abs().max())
    if diff > 1e-2 * max(1.0, float(ref.abs().max())):
        raise SystemExit(
            f"{loaded.name}: transformers does not reproduce our logits (max diff {diff})"
        )
    return diff


def bench_model(name: str, args: argparse.Namespace, workdir: Path) -> list[dict]:
    loaded = load_model(name)
    vocab = loaded.config.vocab_size
    hf = _hf_model(loaded, workdir)
    diff = _check_same_model(loaded, hf, vocab)
    print(f"# {name}: transformers reproduces our logits (max |diff| {diff:.2e})", file=sys.stderr)
    plen, steps, batch = args.prompt_len, args.decode_tokens, args.batch
    eos = dict(eos_token_id=None, pad_token_id=0)
    ours = Ours(loaded.model, max(plen, args.batch_prompt_len) + steps + 4, batch)
    long_prompt = _prompts(1, plen, vocab, seed=1)
    prompts = _prompts(batch, args.batch_prompt_len, vocab, seed=2)

    def ours_prefill() -> float:
        start = time.perf_counter()
        ours.prefill(long_prompt)
        return time.perf_counter() - start

    def hf_prefill() -> float:
        ids = torch.tensor(long_prompt)
        with torch.no_grad():
            start = time.perf_counter()
            hf(ids, logits_to_keep=1)
            return time.perf_counter() - start

    def ours_decode(batch_prompts: list[list[int]]) -> float:
        first = ours.prefill(batch_prompts)
        start = time.perf_counter()
        ours.decode(batch_prompts, first, steps)
        return time.perf_counter() - start

    def hf_generate(batch_prompts: list[list[int]]) -> float:
        x = torch.tensor(batch_prompts)
        with torch.no_grad():
            start = time.perf_counter()
            hf.generate(x, max_new_tokens=1, do_sample=False, **eos)
            t1 = time.perf_counter() - start
            start = time.perf_counter()
            hf.generate(x, max_new_tokens=steps + 1, do_sample=False, **eos)
            return max(time.perf_counter() - start - t1, 1e-9)

    # Each case: (name, tokens, relaykv timer, {baseline: transformers timer}). Within a
    # trial the sides run back to back, so both see the same machine conditions (the CPU
    # may be shared); each reported number is the median over trials.
    cases = [
        (f"prefill {plen}", plen, ours_prefill, {"forward": hf_prefill}),
        (
            "decode b1",
            steps,
            lambda: ours_decode(prompts[:1]),
            {"generate": lambda: hf_generate(prompts[:1])},
        ),
        (
            f"decode b{batch}",
            batch * steps,
            lambda: ours_decode(prompts),
            {
                f"generate x{batch}, one at a time": lambda: sum(hf_generate([p]) for p in prompts),
                "generate, padded batch": lambda: hf_generate(prompts),
            },
        ),
    ]
    ours_prefill(), hf_prefill()  # warm-up
    rows = []
    for case, tokens, mine, baselines in cases:
        t_ours: list[float] = []
        t_hf: dict[str, list[float]] = {b: [] for b in baselines}
        for _ in range(args.repeats):
            t_ours.append(mine())
            for baseline, theirs in baselines.items():
                t_hf[baseline].append(theirs())
        for baseline, times in t_hf.items():
            row = dict(
                model=name,
                case=case,
                ours=tokens / statistics.median(t_ours),
                hf=tokens / statistics.median(times),
                baseline=baseline,
            )
            rows.append(row)
            print(
                f"# {name} {case} vs {baseline}: {row['ours']:.1f} vs {row['hf']:.1f} tok/s",
                file=sys.stderr,
            )
    return rows


def _plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['case']}\nvs {r['baseline'].replace(', ', chr(10))}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(rows)), 5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["hf"] for r in rows], 0.4, label="transformers")
    ax.bar([x + 0.2 for x in xs], [r["ours"] for r in rows], 0.4, label="relaykv")
    for x, r in zip(xs, rows, strict=True):
        ax.annotate(
            f"{r['ours'] / r['hf']:.1f}x",
            (x + 0.2, r["ours"]),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_yscale("log")
    ax.set_ylabel("tokens / s (log)")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_title(f"relaykv model runner vs transformers, CPU, {torch.get_num_threads()} threads")
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny-hybrid,gemma3-270m")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--batch-prompt-len", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_model.png"))
    import bench_model_device  # this directory is on sys.path when run as a script

    bench_model_device.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.device is not None:
        # Gemma-3-270M shapes on one device, roofline, one JSON line (tools/gpu_check.sh).
        return bench_model_device.main(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name == "gemma3-270m" and not is_installed(name):
                print(f"# skipping {name}: package not installed", file=sys.stderr)
                continue
            rows += bench_model(name, args, Path(tmp))
    header = f"{'model':<13} {'case':<12} {'relaykv tok/s':>13} {'transformers':>13}"
    print(f"{header} {'ratio':>7}  baseline")
    for r in rows:
        print(
            f"{r['model']:<13} {r['case']:<12} {r['ours']:>13.1f} {r['hf']:>13.1f} "
            f"{r['ours'] / r['hf']:>6.2f}x  {r['baseline']}"
        )
    _plot(rows, args.out)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(f"# wrote {args.out} and {args.out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
