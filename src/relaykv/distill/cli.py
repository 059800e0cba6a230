"""`relaykv distill-draft`: train an EAGLE draft for a model on its own greedy text.

    relaykv distill-draft --model gemma3-270m --out drafts/gemma
    relaykv distill-draft --model tiny-hybrid --out drafts/tiny --token-budget 50000

Three resumable stages, each with a progress bar: the corpus (the target generates it in
batched dense forwards, tested against the engine; one file per shard under OUT/data),
training (OUT/train/state.pt every few steps; `--token-budget` bounds the positions
trained on), then the EAGLE checkpoint
(OUT/config.json + model.safetensors, float16) and its acceptance on held-out prompts at
K=1 and K=3 (OUT/eval.json, also printed as one JSON line). Rerunning the same command
continues where it stopped. docs/model.md ("Distilling a draft") describes the recipes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from relaykv.distill.recipes import RECIPES


class UsageError(ValueError):
    """A bad flag value (exit status 2, the message names the flag)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help=f"one of: {', '.join(RECIPES)}")
    parser.add_argument("--out", required=True, help="output directory (resumed if present)")
    parser.add_argument(
        "--token-budget",
        type=int,
        default=None,
        metavar="N",
        help="training positions to see before stopping (default: the recipe's)",
    )
    parser.add_argument(
        "--eval-tokens", type=int, default=64, metavar="N", help="tokens per held-out prompt (64)"
    )
    parser.add_argument("--no-eval", action="store_true", help="skip the acceptance measurement")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as exc:
        print(f"relaykv distill-draft: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    recipe = RECIPES.get(args.model)
    if recipe is None:
        raise UsageError(
            f"--model {args.model!r}: no distillation recipe (have: {', '.join(RECIPES)})"
        )
    if args.token_budget is not None and args.token_budget < 1:
        raise UsageError("--token-budget must be >= 1")
    if args.eval_tokens < 1:
        raise UsageError("--eval-tokens must be >= 1")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    import torch

    from relaykv.distill.data import build_corpus, load_corpus, split_validation
    from relaykv.distill.evaluate import measure_acceptance, top1_agreement
    from relaykv.distill.heldout import held_out_prompts
    from relaykv.distill.trainer import positions_per_step, stack_corpus, train_draft
    from relaykv.model import (
        PackageNotInstalled,
        load_eagle_checkpoint,
        load_model,
        save_eagle_checkpoint,
    )

    progress = not args.quiet
    started = time.monotonic()
    try:
        loaded = load_model(recipe.model)
    except PackageNotInstalled as exc:
        raise UsageError(f"--model: {exc}") from None
    paths, validation = split_validation(build_corpus(recipe, loaded, out / "data", progress))
    corpus_s = time.monotonic() - started
    shards = load_corpus(paths)
    data = stack_corpus(shards, recipe.max_len)
    draft = train_draft(
        loaded.model, recipe, data, out / "train" / "state.pt", args.token_budget, progress
    )
    save_eagle_checkpoint(draft.half(), out)
    report: dict[str, object] = {
        "model": recipe.model,
        "out": str(out),
        "corpus_sequences": len(data.tokens),
        "corpus_tokens": sum(s.num_tokens for s in shards),
        "trained_positions": int(
            int(torch.load(out / "train" / "state.pt", weights_only=True)["step"])
            * positions_per_step(recipe, data)
        ),
        "wall_s": round(time.monotonic() - started, 1),
        "corpus_wall_s": round(corpus_s, 1),
        "train_top1": round(top1_agreement(loaded.model, draft, data), 4),
    }
    if validation:
        held = stack_corpus(load_corpus(validation), recipe.max_len)
        report["held_out_top1"] = round(top1_agreement(loaded.model, draft, held), 4)
    if not args.no_eval:
        shipped = load_eagle_checkpoint(out, loaded.config)
        prompts = held_out_prompts(recipe, loaded)
        results = measure_acceptance(
            loaded.model, shipped, prompts, args.eval_tokens, loaded.eos_token_ids
        )
        report["held_out"] = {f"k{r.k}": r.as_dict() for r in results}
        report["wall_s"] = round(time.monotonic() - started, 1)
    (out / "eval.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0
