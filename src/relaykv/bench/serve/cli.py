"""`relaykv bench serve`: a streaming load generator compatible with `vllm bench serve`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from relaykv.bench.client import ApiTarget
from relaykv.bench.metrics import compute_metrics
from relaykv.bench.runner import LoadShape, run_requests
from relaykv.bench.serve import args as serve_args
from relaykv.bench.serve.options import (
    DEFAULT_VOCAB_SIZE,
    UsageError,
    auth_headers,
    base_url,
    check_load_flags,
    choose_prompt_format,
    endpoint,
    is_chat,
    parse_goodput,
    parse_metadata,
    parse_metric_percentiles,
    parse_percentile_metrics,
    sampling_params,
)
from relaykv.bench.serve.report import (
    RunDescription,
    build_result,
    default_result_filename,
    format_result_block,
    write_result,
)
from relaykv.bench.server_info import ServedModel, ServerError, fetch_served_model
from relaykv.bench.text_prompts import PromptTokenizer, as_text_requests
from relaykv.common.workloads import DatasetError
from relaykv.common.workloads.arrivals import distribution_name
from relaykv.common.workloads.flags import apply_general_lengths, build_requests, dataset_seed

PROG = "relaykv bench serve"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serve_args.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(serve(args))
    except (UsageError, DatasetError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1


async def _served_model(url: str, headers: dict[str, str], model_given: bool) -> ServedModel | None:
    try:
        return await fetch_served_model(url, headers)
    except ServerError as exc:
        if not model_given:
            raise
        print(f"WARNING: {exc}; continuing with --model")
        return None


async def serve(args: argparse.Namespace) -> int:
    """Resolve everything, run, print the block, save the JSON; returns the exit status."""
    percentile_metrics = parse_percentile_metrics(args.percentile_metrics)
    percentiles = parse_metric_percentiles(args.metric_percentiles)
    goodput = parse_goodput(args.goodput)
    metadata = parse_metadata(args.metadata)
    check_load_flags(args)
    apply_general_lengths(args)
    path = endpoint(args)
    chat = is_chat(path)
    requested_format = "ids" if args.tokenize_prompt else args.prompt_format
    choose_prompt_format(
        requested_format,
        chat=chat,
        have_tokenizer=args.tokenizer is not None,
        server_is_relaykv=False,
    )  # fail fast, before any network call
    tokenizer = PromptTokenizer(args.tokenizer) if args.tokenizer else None

    url = base_url(args)
    headers = auth_headers(args.api_key)
    served = await _served_model(url, headers, model_given=args.model is not None)
    model_id = args.model or served.id  # type: ignore[union-attr]
    if args.model is None:
        print(f"Model not specified, using the server's first model: {model_id}")
    prompt_format = choose_prompt_format(
        requested_format,
        chat=chat,
        have_tokenizer=tokenizer is not None,
        server_is_relaykv=bool(served and served.is_relaykv),
    )
    vocab_size, vocab_source = _vocab_size(args.vocab_size, tokenizer, served)
    print(f"Prompts: {prompt_format}; random token ids from [0, {vocab_size}) ({vocab_source})")

    ignore_eos = args.ignore_eos
    if args.dataset_name == "random" and not ignore_eos:
        ignore_eos = True  # vLLM: random prompts run to their requested length
        print("Dataset random: setting ignore_eos so outputs reach the requested length")
    text = prompt_format == "text"
    requests = build_requests(
        args,
        vocab_size,
        special_ids=tokenizer.special_ids if tokenizer else [],
        num_special=tokenizer.num_special_tokens_to_add() if tokenizer and text else 0,
    )
    if text:
        mismatch = as_text_requests(requests, tokenizer, dataset_seed(args))  # type: ignore[arg-type]
        if mismatch:
            print(f"WARNING: text prompts re-encode to {mismatch:+d} tokens in total")
    if args.temperature is None:
        print("WARNING: no --temperature given; the server's default sampling applies")

    target = ApiTarget(
        api_url=url + path,
        model=args.served_model_name or model_id,
        chat=chat,
        headers=headers,
        sampling=sampling_params(args),
        ignore_eos=ignore_eos,
        timeout_s=args.request_timeout,
    )
    shape = LoadShape(
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        num_warmups=args.num_warmups,
        seed=dataset_seed(args),
    )
    if shape.num_warmups:
        print(f"Warming up with {shape.num_warmups} requests...")
    print(f"Traffic request rate: {args.request_rate}")
    print(f"Burstiness factor: {args.burstiness} ({distribution_name(args.burstiness)})")
    print(f"Maximum request concurrency: {args.max_concurrency}")
    outcome = await run_requests(target, requests, shape, progress=not args.disable_tqdm)

    metrics = compute_metrics(outcome.outcomes, outcome.duration_s, percentiles, goodput)
    failures = [o for o in outcome.outcomes if not o.success]
    if failures:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, failed in enumerate(failures[:10]):
            print(f"Error {i}: {failed.error}")
    description = RunDescription(
        backend=args.backend,
        model_id=model_id,
        num_prompts=len(requests),
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        label=args.label,
        tokenizer_id=args.tokenizer,
        goodput=goodput,
        percentile_metrics=percentile_metrics,
        metadata=metadata,
    )
    print(format_result_block(description, metrics, outcome.duration_s))
    result = build_result(
        description, metrics, outcome.duration_s, outcome.outcomes, detailed=args.save_detailed
    )
    if args.save_result or args.result_filename or args.result_dir:
        name = args.result_filename or default_result_filename(description, result["date"])
        where = Path(args.result_dir) / name if args.result_dir else Path(name)
        print(f"Result written to {write_result(result, where)}")
    return 0 if metrics.completed else 1


def _vocab_size(
    flag: int | None, tokenizer: PromptTokenizer | None, served: ServedModel | None
) -> tuple[int, str]:
    if flag is not None:
        return flag, "--vocab-size"
    if tokenizer is not None:
        return tokenizer.vocab_size, "tokenizer"
    if served is not None and served.vocab_size is not None:
        return served.vocab_size, "/v1/models vocab_size"
    return DEFAULT_VOCAB_SIZE, "default; pass --vocab-size or --tokenizer to change it"
