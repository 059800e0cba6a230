"""Checking and resolving `bench serve` flags: pure functions, errors name the flag."""

from __future__ import annotations

import argparse
import math
import os

from relaykv.bench.metrics import METRIC_NAMES

DEFAULT_VOCAB_SIZE = 32000
GOODPUT_NAMES: tuple[str, ...] = ("ttft", "tpot", "e2el")


class UsageError(ValueError):
    """A bad flag value; the CLI prints it and exits with status 2."""


def parse_percentile_metrics(text: str | None) -> list[str]:
    names = [n.strip() for n in (text or "ttft,tpot,itl").split(",") if n.strip()]
    bad = [n for n in names if n not in METRIC_NAMES]
    if bad or not names:
        raise UsageError(
            f"--percentile-metrics: unknown metric(s) {bad or text!r}; allowed: "
            + ",".join(METRIC_NAMES)
        )
    return list(dict.fromkeys(names))


def parse_metric_percentiles(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--metric-percentiles: not a comma list of numbers: {text!r}") from None
    if not values or any(not 0 <= p <= 100 for p in values):
        raise UsageError(f"--metric-percentiles: values must be in [0, 100], got {text!r}")
    return values


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or math.isnan(number):
            raise UsageError(f"--goodput: expected KEY:MILLISECONDS, got {pair!r}")
        if name not in GOODPUT_NAMES:
            raise UsageError(
                f"--goodput: unknown metric {name!r}; allowed: " + ", ".join(GOODPUT_NAMES)
            )
        if number < 0:
            raise UsageError(f"--goodput: {name} must be >= 0 ms, got {number}")
        slos[name] = number
    return slos


def parse_metadata(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--metadata: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def check_load_flags(args: argparse.Namespace) -> None:
    if not args.request_rate > 0:
        raise UsageError(f"--request-rate must be > 0, got {args.request_rate}")
    if not args.burstiness > 0:
        raise UsageError(f"--burstiness must be > 0, got {args.burstiness}")
    if args.max_concurrency is not None and args.max_concurrency <= 0:
        raise UsageError(f"--max-concurrency must be > 0, got {args.max_concurrency}")
    if args.num_warmups < 0:
        raise UsageError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if not args.request_timeout > 0:
        raise UsageError(f"--request-timeout must be > 0, got {args.request_timeout}")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise UsageError(f"--vocab-size must be >= 1, got {args.vocab_size}")


def base_url(args: argparse.Namespace) -> str:
    if args.base_url:
        return args.base_url.rstrip("/")
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"http://{host}:{args.port}"


def endpoint(args: argparse.Namespace) -> str:
    """Backend picks the default path; the path picks the payload (chat or completions)."""
    if args.endpoint:
        return args.endpoint if args.endpoint.startswith("/") else "/" + args.endpoint
    return "/v1/chat/completions" if args.backend == "openai-chat" else "/v1/completions"


def is_chat(path: str) -> bool:
    return path.rstrip("/").endswith("chat/completions")


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def choose_prompt_format(
    requested: str, *, chat: bool, have_tokenizer: bool, server_is_relaykv: bool
) -> str:
    """ "ids" or "text" (see docs/benchmarking.md "Prompts: token ids or text")."""
    if requested == "ids" and chat:
        raise UsageError(
            "--prompt-format ids/--tokenize-prompt: a chat endpoint takes text "
            "messages; use /v1/completions or text prompts"
        )
    if (requested == "text" or chat) and not have_tokenizer:
        raise UsageError(
            "--tokenizer is required to send text prompts (chat endpoints or "
            "--prompt-format text): the datasets are random token ids"
        )
    if requested != "auto":
        return requested
    if chat or (have_tokenizer and not server_is_relaykv):
        return "text"
    return "ids"


def sampling_params(args: argparse.Namespace) -> dict[str, float | int]:
    params = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    return {k: v for k, v in params.items() if v is not None}
