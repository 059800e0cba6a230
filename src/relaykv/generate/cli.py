"""`relaykv generate`: offline generation from the command line.

    relaykv generate --prompt "Hello" --max-tokens 32
    relaykv generate --model gemma3-270m --prompt "The capital of France is" --json
    relaykv generate --prompt-ids 1,72,101 --speculative-tokens 3 --logprobs 5 --json

`--json` prints one object per prompt: `{"prompt_ids", "output_ids", "text", "logprobs"}`
(`logprobs`: for each generated position, the top-K `[token_id, logprob]` pairs of the raw
model distribution; null unless `--logprobs` is given). Errors name the flag and exit 2.

It runs the serving engine offline: `LLMEngine` (the scheduler and the cache lifecycle of
docs/design.md §10) over a `ModelRunner`, with a pool sized for every prompt at once, so what
`generate` prints is what `relaykv serve` computes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from relaykv.common.model_names import PRESET_NAMES

if TYPE_CHECKING:  # torch: imported only when the command runs
    from relaykv.engine import LLMEngine
    from relaykv.model import EagleDraft, LoadedModel, ModelRunner


class UsageError(ValueError):
    """A bad flag value found after parsing (exit status 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="tiny-hybrid",
        help=f"{' | '.join(PRESET_NAMES)} | HF directory | .gguf file "
        "(default: tiny-hybrid, embedded, no download)",
    )
    parser.add_argument(
        "--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)"
    )
    parser.add_argument(
        "--prompt-ids",
        action="append",
        default=[],
        metavar="IDS",
        help="a prompt as comma-separated token ids, e.g. 1,2,3 (repeatable)",
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (32)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument(
        "--seed", type=int, default=0, help="sampling seed; prompt i uses seed + i (default 0)"
    )
    parser.add_argument(
        "--speculative-tokens",
        type=int,
        default=0,
        metavar="K",
        help="EAGLE draft tokens per step (tiny-hybrid and gemma3-270m have a built-in draft)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        metavar="PATH|random",
        help="EAGLE checkpoint directory, or 'random' (default: the model's built-in "
        "distilled draft)",
    )
    parser.add_argument(
        "--logprobs",
        type=int,
        default=0,
        metavar="K",
        help="return the top-K log-probabilities of each generated position",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--block-size", type=int, default=16, help="KV block size (16)")


def _check_flags(args: argparse.Namespace) -> None:
    if not args.prompt and not args.prompt_ids:
        raise UsageError("give at least one --prompt or --prompt-ids")
    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be >= 1")
    if args.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    if not 0 < args.top_p <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    if args.top_k < 0:
        raise UsageError("--top-k must be >= 0")
    if args.logprobs < 0:
        raise UsageError("--logprobs must be >= 0")
    if args.speculative_tokens < 0:
        raise UsageError("--speculative-tokens must be >= 0")
    if args.block_size < 1:
        raise UsageError("--block-size must be >= 1")


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--prompt-ids {text!r}: expected comma-separated integers") from None
    if not ids:
        raise UsageError("--prompt-ids: empty prompt")
    return ids


def _prompts(args: argparse.Namespace, loaded: LoadedModel) -> list[list[int]]:
    prompts = [_parse_ids(text) for text in args.prompt_ids]
    if args.prompt:
        tokenizer = loaded.tokenizer
        if tokenizer is None:
            raise UsageError(f"--prompt: model {args.model} has no tokenizer; use --prompt-ids")
        prompts = [tokenizer.encode(text) for text in args.prompt] + prompts
    vocab = loaded.config.vocab_size
    for ids in prompts:
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise UsageError(f"--prompt-ids: token ids {bad[:5]} outside vocabulary 0..{vocab - 1}")
        if not ids:
            raise UsageError("--prompt: a prompt encodes to no tokens")
    return prompts


def _draft(args: argparse.Namespace, loaded: LoadedModel) -> EagleDraft | None:
    from relaykv.model.eagle import load_eagle_checkpoint, random_draft

    config = loaded.config
    dtype = loaded.model.dtype
    if args.speculative_tokens == 0:
        return None
    if args.draft_model == "random":
        return random_draft(config, seed=args.seed, dtype=dtype)
    if args.draft_model is None:
        from relaykv.model.drafts import NoDefaultDraft, default_draft

        try:
            return default_draft(args.model, config, dtype)
        except NoDefaultDraft as exc:
            raise UsageError(f"--speculative-tokens: {exc}") from None
    try:
        return load_eagle_checkpoint(args.draft_model, config, dtype)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--draft-model: {exc}") from None


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as exc:
        print(f"relaykv generate: error: {exc}", file=sys.stderr)
        return 2


def _engine(
    args: argparse.Namespace,
    loaded: LoadedModel,
    draft: EagleDraft | None,
    prompts: list[list[int]],
) -> tuple[LLMEngine, ModelRunner]:
    """An `LLMEngine` over a `ModelRunner` whose pool holds every prompt at once."""
    from relaykv.engine import EngineConfig, LLMEngine, SchedulerConfig
    from relaykv.kvcache import CacheSizing
    from relaykv.model.kv_layout import derive_layout
    from relaykv.model.runner import ModelRunner

    k = args.speculative_tokens
    shape = draft.attention_shape() if draft is not None else None
    layout = derive_layout(loaded.config, args.block_size, loaded.model.dtype, shape)
    max_model_len = max(len(p) for p in prompts) + args.max_tokens + k + 1
    scheduler = SchedulerConfig(
        max_num_batched_tokens=2048, max_num_seqs=len(prompts), max_model_len=max_model_len
    )
    per_request = CacheSizing.build(
        layout.geometry, 2, max_model_len, scheduler.max_num_batched_tokens + k
    ).blocks_per_request
    runner = ModelRunner(
        loaded.model,
        num_blocks=1 + len(prompts) * per_request,
        block_size=args.block_size,
        draft=draft,
        num_speculative_tokens=k,
    )
    config = EngineConfig(num_blocks=runner.kv.num_blocks, scheduler=scheduler)
    engine = LLMEngine(
        runner,
        config,
        eos_token_ids=loaded.eos_token_ids,
        vocab_size=loaded.config.vocab_size,
    )
    return engine, runner


def _run(args: argparse.Namespace) -> int:
    _check_flags(args)
    from tqdm import tqdm

    from relaykv.common.messages.steps import SamplingParams
    from relaykv.model.loading import PackageNotInstalled, load_model

    try:
        loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    except (PackageNotInstalled, ValueError, OSError) as exc:
        raise UsageError(f"--model: {exc}") from None
    prompts = _prompts(args, loaded)
    draft = _draft(args, loaded)
    engine, runner = _engine(args, loaded, draft, prompts)
    params = [
        SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed + i,
            logprobs=args.logprobs,
            ignore_eos=args.ignore_eos,
        )
        for i in range(len(prompts))
    ]
    started = time.perf_counter()
    results = [
        engine.add_request(f"prompt-{i}", prompt, sp)
        for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    with tqdm(
        total=len(prompts) * args.max_tokens,
        desc="tokens",
        unit="tok",
        file=sys.stderr,
        disable=None,
        leave=False,
    ) as bar:
        while engine.has_unfinished():
            bar.update(sum(len(out.new_token_ids) for out in engine.step()))
    elapsed = time.perf_counter() - started
    failed = [r for r in results if r.error]
    if failed:
        raise RuntimeError(f"generation failed: {failed[0].error}")
    tokenizer = loaded.tokenizer
    for result in results:
        text = tokenizer.decode(result.output_ids) if tokenizer is not None else None
        if args.json:
            logprobs = None
            if args.logprobs:
                logprobs = [[[tid, lp] for tid, lp in pos.top] for pos in result.logprobs]
            print(
                json.dumps(
                    {
                        "prompt_ids": result.prompt_ids,
                        "output_ids": result.output_ids,
                        "text": text,
                        "logprobs": logprobs,
                    }
                )
            )
        else:
            print(text if text is not None else " ".join(map(str, result.output_ids)))
    generated = sum(len(r.output_ids) for r in results)
    stats = runner.stats
    if args.json:
        # stdout stays one object per prompt; the run's summary is one object on stderr.
        report: dict[str, object] = {"prompts": len(results), "tokens": generated}
        report["seconds"] = round(elapsed, 3)
        if args.speculative_tokens:
            report["speculative_tokens"] = args.speculative_tokens
            report["draft_acceptance"] = round(stats.acceptance_rate, 4)
            report["mean_accepted_length"] = round(stats.mean_accepted_length, 4)
            report["num_drafts"] = stats.num_drafts
            report["num_draft_tokens"] = stats.num_draft_tokens
            report["num_accepted_tokens"] = stats.num_accepted_tokens
        print(json.dumps({"summary": report}), file=sys.stderr)
        return 0
    summary = f"{len(results)} prompts, {generated} tokens in {elapsed:.2f}s"
    if args.speculative_tokens:
        summary += f", draft acceptance {stats.acceptance_rate:.0%}"
    print(summary, file=sys.stderr)
    return 0
