"""`relaykv probe`: the fixed-engine P/D prefix-cache probe against a running cluster.

The requests go to `--url` (any OpenAI-compatible P/D front end: relaykv's router,
vllm-router, ...). The decode engines whose counters are read come from `--decode` (and
`--prefill`, listed in the JSON) when given, else from relaykv's router's `/cluster`; a
production router has no `/cluster`, so behind it name the engines (docs/pd.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys

from relaykv.bench.client import ApiTarget
from relaykv.bench.engine_counters import ClusterUrls
from relaykv.bench.probe.run import REPORTED, ProbeReport, probe_prompts, run_probe
from relaykv.bench.server_info import ServerError, fetch_served_model

DEFAULT_VOCAB_SIZE = 32000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", required=True, help="the P/D front end's base URL (relaykv router, vllm-router)"
    )
    parser.add_argument(
        "--prefill",
        action="append",
        default=[],
        metavar="URL[,URL...]",
        help="prefill engine URLs (repeatable); with --decode, /cluster is not needed",
    )
    parser.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="URL[,URL...]",
        help="decode engine URLs whose counters are read (repeatable; default: the "
        "router's /cluster)",
    )
    parser.add_argument("--prefix-len", type=int, default=8192, help="shared prefix x (tokens)")
    parser.add_argument("--suffix-len", type=int, default=16, help="suffixes a and b (tokens)")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of x, a, b (default: a fresh random seed, printed, so x is new to the cache)",
    )
    parser.add_argument("--model", default=None, help="model name (default: from /v1/models)")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help=f"token ids are drawn from [0, V) (default: /v1/models vocab_size, else "
        f"{DEFAULT_VOCAB_SIZE})",
    )
    parser.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    parser.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds to wait after a phase before reading the counters",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON result")


def _headers(api_key: str | None) -> dict[str, str]:
    key = api_key or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def format_table(report: ProbeReport) -> str:
    rows = [("phase", "requests_ok", *REPORTED)]
    for p in report.phases:
        ok = f"{p.requests_ok}/{report.requests_sent[p.name]}"
        rows.append(
            (
                p.name,
                ok,
                str(p.local_hit_tokens),
                str(p.external_hit_tokens),
                str(p.kv_bytes_received),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def engine_urls(values: list[str], flag: str) -> tuple[str, ...]:
    """`--decode A,B --decode C` -> (A, B, C); a URL must be http(s)://host[:port]."""
    urls = tuple(u.strip().rstrip("/") for v in values for u in v.split(",") if u.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{flag}: expected an http(s):// URL, got {url!r}")
    return urls


def named_cluster(url: str, prefill: list[str], decode: list[str]) -> ClusterUrls | None:
    """The engines named on the command line, or None to ask the router's /cluster."""
    decode_urls = engine_urls(decode, "--decode")
    prefill_urls = engine_urls(prefill, "--prefill")
    if prefill_urls and not decode_urls:
        raise ValueError("--prefill needs --decode: the probe reads the decode engines")
    if not decode_urls:
        return None
    return ClusterUrls(router=url.rstrip("/"), prefill=prefill_urls, decode=decode_urls)


async def probe_router(
    url: str,
    *,
    cluster: ClusterUrls | None = None,
    prefix_len: int,
    suffix_len: int,
    seed: int,
    model: str | None = None,
    vocab_size: int | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    settle_s: float = 0.5,
    log=lambda _: None,
) -> ProbeReport:
    """Resolve model and vocabulary from the router, then run the probe."""
    base = url.rstrip("/")
    served = None
    if model is None or vocab_size is None:
        served = await fetch_served_model(base, headers)
    model = model or served.id  # type: ignore[union-attr]
    vocab = vocab_size or (served.vocab_size if served else None) or DEFAULT_VOCAB_SIZE
    if vocab_size is None and (served is None or served.vocab_size is None):
        log(f"vocabulary size not published by /v1/models; using {vocab}")
    prompts = probe_prompts(prefix_len, suffix_len, vocab, seed)
    target = ApiTarget(
        api_url=f"{base}/v1/completions",
        model=model,
        headers=dict(headers or {}),
        sampling={"temperature": 0.0},
        timeout_s=timeout_s,
    )
    return await run_probe(target, base, prompts, settle_s=settle_s, log=log, cluster=cluster)


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(f"probe: {message}", file=sys.stderr)

    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    try:
        probe_prompts(args.prefix_len, args.suffix_len, args.vocab_size or 2, seed)
        cluster = named_cluster(args.url, args.prefill, args.decode)
    except ValueError as exc:
        print(f"relaykv probe: error: {exc}", file=sys.stderr)
        return 2
    log(
        f"router {args.url}, prefix {args.prefix_len} + suffix {args.suffix_len} tokens, "
        f"seed {seed}"
    )
    try:
        report = asyncio.run(
            probe_router(
                args.url,
                cluster=cluster,
                prefix_len=args.prefix_len,
                suffix_len=args.suffix_len,
                seed=seed,
                model=args.model,
                vocab_size=args.vocab_size,
                headers=_headers(args.api_key),
                timeout_s=args.timeout,
                settle_s=args.settle,
                log=log,
            )
        )
    except ServerError as exc:
        print(f"relaykv probe: {exc}", file=sys.stderr)
        return 1
    for error in report.errors:
        log(f"request failed: {error}")
    for name in report.missing_counters:
        log(f"warning: no decode engine exposes the counter behind {name}; reported as 0")
    if args.json:
        print(json.dumps(report.as_json()))
    else:
        print(f"decode engines: {', '.join(report.decode_urls) or '(none)'}")
        print(format_table(report))
    return 0 if report.all_ok else 1
