"""`relaykv router`: the P/D router in front of prefill and decode engines."""

from __future__ import annotations

import argparse
import logging
import os

from relaykv.common.plumbing.derived_keys import KV_SECRET_ENV, read_cluster_secret
from relaykv.common.plumbing.secret_files import PrivateFileError, resolve_api_key
from relaykv.router.app import create_router_app
from relaykv.router.intake import DEFAULT_MAX_BODY_BYTES, IntakeLimits
from relaykv.router.policy import (
    DEFAULT_CONDITIONAL_MAX_RUNNING,
    DEFAULT_CONDITIONAL_MAX_SUFFIX,
    DISAGGREGATION_MODES,
    ROUTING_MODES,
    CacheAwareWeights,
    ConditionalRule,
)
from relaykv.router.relay import Router
from relaykv.router.routing import Routing
from relaykv.router.server import serve_router


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", required=True, help="prefill engine URL(s), comma-separated")
    parser.add_argument("--decode", required=True, help="decode engine URL(s), comma-separated")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None,
                        help="require this key from clients (default: $RELAYKV_API_KEY); "
                        "visible on a command line: prefer --api-key-file")
    parser.add_argument("--api-key-file", default=None,
                        help="file (mode 0600) holding the key (default $RELAYKV_API_KEY_FILE)")
    parser.add_argument("--kv-secret-file", default=os.environ.get(KV_SECRET_ENV) or None,
                        help="the cluster secret (mode 0600; default $RELAYKV_KV_SECRET_FILE): "
                        "subscribes to KV events published off an engine's host, which are "
                        "CURVE-encrypted with keys derived from it (docs/kv-events.md)")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--prefill-timeout", type=float, default=120.0,
                        help="seconds a prefill engine may take for one request before the "
                        "router tries another (default 120)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get 413 (default 8 MiB)")
    parser.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a connection may take to send its request headers")
    parser.add_argument("--body-timeout", type=float, default=30.0,
                        help="seconds a client may take to send its request body (else 408)")
    parser.add_argument("--drain-timeout", type=float, default=60.0,
                        help="on SIGTERM, seconds in-flight requests may take to finish")
    parser.add_argument("--log-level", default="warning")
    routing = parser.add_argument_group("routing (docs/routing.md)")
    routing.add_argument(
        "--routing",
        default="cache-aware",
        choices=ROUTING_MODES,
        help="how engines are chosen (default cache-aware: usable prefix hit "
        "from the engines' KV events, balanced against load)",
    )
    defaults = CacheAwareWeights()
    for name, help_text in (
        ("hit_weight", "score per fraction of the prompt usable on the engine"),
        ("load_weight", "score lost per request in flight above the least-loaded engine"),
        ("kv_weight", "score lost per unit of the engine's KV cache usage (0..1)"),
        ("queue_weight", "requests one waiting request of the engine's own queue counts as"),
        ("max_load_ratio", "never pick an engine whose load would exceed this x the mean"),
    ):
        routing.add_argument(
            "--" + name.replace("_", "-"),
            type=float,
            default=getattr(defaults, name),
            help=f"{help_text} (default {getattr(defaults, name)})",
        )
    add_disaggregation_arguments(parser)


def add_disaggregation_arguments(parser: argparse.ArgumentParser) -> None:
    """`--disaggregation` and the conditional rule's inputs (also `relaykv up`'s)."""
    group = parser.add_argument_group("conditional disaggregation (docs/routing.md)")
    group.add_argument(
        "--disaggregation",
        default="conditional",
        choices=DISAGGREGATION_MODES,
        help="conditional (default): a request whose uncached suffix on its decode engine is "
        "short goes straight there (D prefills it); always: every request P -> D; never: "
        "every request to a decode engine alone (colocated-style)",
    )
    group.add_argument(
        "--conditional-max-suffix",
        type=int,
        default=DEFAULT_CONDITIONAL_MAX_SUFFIX,
        metavar="TOKENS",
        help="the longest suffix a decode engine prefills itself "
        f"(default {DEFAULT_CONDITIONAL_MAX_SUFFIX})",
    )
    group.add_argument(
        "--conditional-max-queued-prefill",
        type=int,
        default=None,
        metavar="TOKENS",
        help="per decode engine, the local prefill tokens this router may have in flight "
        "there, the new request's included (default: the max suffix)",
    )
    group.add_argument(
        "--conditional-max-running",
        type=int,
        default=DEFAULT_CONDITIONAL_MAX_RUNNING,
        metavar="STREAMS",
        help="a decode engine takes a local request only while at most STREAMS of this "
        "router's requests decode there (asked for more than one token: a local prefill "
        f"stalls each of them one step; default {DEFAULT_CONDITIONAL_MAX_RUNNING})",
    )


def conditional_rule(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ConditionalRule:
    """The rule from parsed arguments; a bad value exits naming its flag."""
    for flag, value in (
        ("--conditional-max-suffix", args.conditional_max_suffix),
        ("--conditional-max-queued-prefill", args.conditional_max_queued_prefill),
        ("--conditional-max-running", args.conditional_max_running),
    ):
        if value is not None and value < 0:
            parser.error(f"argument {flag}: must be >= 0, got {value}")
    return ConditionalRule(
        args.disaggregation,
        args.conditional_max_suffix,
        args.conditional_max_queued_prefill,
        args.conditional_max_running,
    )


def _urls(parser: argparse.ArgumentParser, flag: str, text: str) -> list[str]:
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls or any(not u.startswith(("http://", "https://")) for u in urls):
        parser.error(f"argument {flag}: expected http(s) URLs separated by commas, got {text!r}")
    return urls


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not 0 < args.port < 65536:
        parser.error(f"argument --port: must be in 1..65535, got {args.port}")
    if args.request_timeout <= 0:
        parser.error("argument --request-timeout: must be > 0")
    try:
        api_key = resolve_api_key(args.api_key, args.api_key_file)
    except PrivateFileError as exc:
        parser.error(f"argument --api-key-file: {exc}")
    kv_secret = None
    if args.kv_secret_file:
        try:
            kv_secret = read_cluster_secret(args.kv_secret_file)
        except PrivateFileError as exc:
            parser.error(f"argument --kv-secret-file: {exc}")
    try:
        limits = IntakeLimits(args.max_body_bytes, args.body_timeout, args.header_timeout)
    except ValueError as exc:
        parser.error(f"argument --max-body-bytes/--body-timeout/--header-timeout: {exc}")
    if args.prefill_timeout <= 0 or args.drain_timeout < 0:
        parser.error("argument --prefill-timeout/--drain-timeout: must be > 0 (>= 0 for drain)")
    prefill = _urls(parser, "--prefill", args.prefill)
    decode = _urls(parser, "--decode", args.decode)
    try:
        weights = CacheAwareWeights(
            args.hit_weight,
            args.load_weight,
            args.kv_weight,
            args.queue_weight,
            args.max_load_ratio,
        )
    except ValueError as exc:
        flag = "--" + str(exc).split()[0].replace("_", "-")
        parser.error(f"argument {flag}: {exc}")
    rule = conditional_rule(args, parser)
    logging.basicConfig(level=args.log_level.upper())
    host = f"[{args.host}]" if ":" in args.host else args.host
    router = Router(
        prefill, decode, api_key=api_key, request_timeout=args.request_timeout,
        prefill_timeout=args.prefill_timeout, limits=limits,
        public_url=f"http://{host}:{args.port}",
        routing=Routing(
            args.routing, weights, api_key=api_key, conditional=rule, kv_secret=kv_secret
        ),
    )
    print(f"relaykv router on http://{host}:{args.port} (--routing {args.routing}, "
          f"--disaggregation {rule.mode}): "
          f"prefill {prefill}, decode {decode}", flush=True)
    return serve_router(create_router_app(router), router, args.host, args.port,
                        log_level=args.log_level, drain_timeout=args.drain_timeout,
                        header_timeout_s=args.header_timeout)
