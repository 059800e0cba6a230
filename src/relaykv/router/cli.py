"""`relaykv router`: the P/D router in front of prefill and decode engines."""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn

from relaykv.router.relay import Router, create_router_app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", required=True, help="prefill engine URL(s), comma-separated")
    parser.add_argument("--decode", required=True, help="decode engine URL(s), comma-separated")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("RELAYKV_API_KEY"),
                        help="require this key from clients (default: $RELAYKV_API_KEY)")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--log-level", default="warning")


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
    prefill = _urls(parser, "--prefill", args.prefill)
    decode = _urls(parser, "--decode", args.decode)
    logging.basicConfig(level=args.log_level.upper())
    host = f"[{args.host}]" if ":" in args.host else args.host
    router = Router(
        prefill, decode, api_key=args.api_key, request_timeout=args.request_timeout,
        public_url=f"http://{host}:{args.port}",
    )
    print(f"relaykv router on http://{host}:{args.port}: prefill {prefill}, decode {decode}",
          flush=True)
    uvicorn.run(create_router_app(router), host=args.host, port=args.port,
                log_level=args.log_level, timeout_graceful_shutdown=30)
    return 0
