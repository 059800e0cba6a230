"""`relaykv up`: a local P/D cluster (prefill, decode, router) on this machine.

Engine flags not listed here (`--max-model-len`, `--kv-cache-memory`, `--num-blocks`,
`--block-size`, `--retention`, `--speculative-tokens`, `--draft-model`, `--seed`, ...) are
passed to every engine unchanged, so `relaykv up` accepts what `relaykv serve` accepts.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from relaykv.launch.cluster import Cluster, ClusterError

FORWARDS_UNKNOWN_FLAGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-hybrid")
    parser.add_argument("--pd-policy", default="per-group",
                        choices=["legacy", "replay-slack", "exact", "per-group"])
    parser.add_argument("--kv-transport", default="shm", choices=["shm", "tcp", "nixl", "mooncake"])
    parser.add_argument("--num-prefill", type=int, default=1)
    parser.add_argument("--num-decode", type=int, default=1)
    parser.add_argument("--routing", default="cache-aware",
                        choices=["cache-aware", "least-loaded", "round-robin"],
                        help="the router's engine choice (docs/routing.md); cache-aware turns "
                        "on every engine's KV events")
    parser.add_argument("--host", default="127.0.0.1", help="address every member binds")
    parser.add_argument("--port", type=int, default=None, help="router port (default: a free one)")
    parser.add_argument("--api-key", default=None, help="required by the router and engines")
    parser.add_argument("--log-dir", default=None, help="member logs (default: a temp dir)")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds")
    parser.add_argument("--json", action="store_true",
                        help='print one line {"router": URL, "prefill": [URL], "decode": [URL]}')


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # Unknown flags belong to the engines (validated by `relaykv serve` itself).
    engine_extra: list[str] = getattr(args, "_extra", [])
    if args.num_prefill < 1 or args.num_decode < 1:
        parser.error("argument --num-prefill/--num-decode: need at least one of each")
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"argument --port: must be in 1..65535, got {args.port}")
    common = ["--model", args.model, "--pd-policy", args.pd_policy,
              "--kv-transport", args.kv_transport, *engine_extra]
    auth = ["--api-key", args.api_key] if args.api_key else []
    cluster = Cluster(
        engine_args=common + auth, router_args=[*auth, "--routing", args.routing],
        kv_events=args.routing == "cache-aware", num_prefill=args.num_prefill,
        num_decode=args.num_decode, host=args.host, router_port=args.port,
        log_dir=Path(args.log_dir) if args.log_dir else None,
    )
    cluster.plan()

    def say(message: str) -> None:
        print(f"[relaykv up] {message}", file=sys.stderr, flush=True)

    say(f"starting {args.num_prefill} prefill + {args.num_decode} decode engines ({args.model}, "
        f"--pd-policy {args.pd_policy}, --kv-transport {args.kv_transport}) and a router; "
        f"logs in {cluster.log_dir}")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster.start(timeout=args.startup_timeout, progress=say)
    except ClusterError as exc:
        say(str(exc))
        return 1
    info = cluster.describe()
    if args.json:
        print(json.dumps(info), flush=True)
    else:
        print(f"router  {info['router']}\nprefill {' '.join(info['prefill'])}\n"
              f"decode  {' '.join(info['decode'])}\n(Ctrl-C stops the cluster)", flush=True)
    while not stop.wait(0.5):
        dead = [m for m in cluster.members if m.process and m.process.poll() is not None]
        if dead:
            say(f"{dead[0].name} exited (status {dead[0].process.returncode}); stopping the cluster"
                f"\n{dead[0].log_tail()}")
            cluster.stop()
            return 1
    say("stopping")
    cluster.stop()
    return 0
