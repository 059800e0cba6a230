"""`relaykv up`: a local P/D cluster (prefill, decode, router) on this machine, supervised.

It makes a private runtime directory (run_dir.py: mode 0700, removed at every exit `up`
survives, reaped by the next `up` after a SIGKILL) for the cluster's KV transfer secret,
which it generates there unless given `--kv-secret-file`, and for the engines' KV event
sockets (`ipc://`, cluster.py); hands the secret and the API key to every member through the
environment, never argv (docs/security.md, "Listeners"); restarts dead members
(supervisor.py); and on SIGTERM, SIGINT or SIGHUP, also during startup, drains in order
(cluster.py). The members' logs go to `--log-dir`, or to a temp directory that is removed
when every member exited 0 and kept (and named) otherwise. With
`--kv-offloading-backend mooncake` it also starts a Mooncake Store master (a supervised
member, loopback) and points every engine at it (docs/tier.md, "Mooncake Store").

Engine flags not listed here (`--max-model-len`, `--kv-cache-memory`, `--num-blocks`,
`--block-size`, `--retention`, `--speculative-tokens`, `--draft-model`, `--seed`, ...) are
passed to every engine unchanged, so `relaykv up` accepts what `relaykv serve` accepts.
`--disaggregation` and the conditional rule's flags go to the router (docs/routing.md); unless
it is `always`, the engines also get `--sibling-reach` (`policy.default_sibling_reach` of the
rule's max suffix) when not given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from relaykv.common.plumbing.secret_files import API_KEY_ENV, PrivateFileError, resolve_api_key
from relaykv.launch.cluster import Cluster, ClusterError
from relaykv.launch.run_dir import RunDir, reap_stale
from relaykv.launch.supervisor import RestartPolicy, Supervisor
from relaykv.router.cli import add_disaggregation_arguments, conditional_rule
from relaykv.router.policy import default_sibling_reach
from relaykv.serve.assembly.cpu_threads import colocated_engine_env, positive_threads
from relaykv.serve.assembly.options import DEFAULT_PD_POLICY, PD_POLICIES
from relaykv.serve.assembly.pd_wiring import (
    KV_SECRET_ENV,
    clean_stale_shared_memory,
    load_kv_secret,
    new_kv_secret,
)

FORWARDS_UNKNOWN_FLAGS = True
DEFAULT_STORE_GIB = 0.25  # each engine's KV tier under --kv-offloading-backend, unless given


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-hybrid")
    parser.add_argument("--pd-policy", default=DEFAULT_PD_POLICY.value, choices=PD_POLICIES)
    parser.add_argument("--kv-transport", default="shm", choices=["shm", "tcp", "nixl", "mooncake"])
    parser.add_argument("--kv-offloading-backend", default=None, choices=["native", "mooncake"],
                        help="every engine gets a KV tier (docs/tier.md): native (host memory "
                        "of each engine) or mooncake (a Mooncake Store the engines share; "
                        "`up` starts its master); with --kv-offloading-size GIB per engine "
                        f"(default {DEFAULT_STORE_GIB} GiB)")
    parser.add_argument("--num-prefill", type=int, default=1)
    parser.add_argument("--num-decode", type=int, default=1)
    parser.add_argument("--routing", default="cache-aware",
                        choices=["cache-aware", "least-loaded", "round-robin"],
                        help="the router's engine choice (docs/routing.md); cache-aware turns "
                        "on every engine's KV events")
    add_disaggregation_arguments(parser)
    parser.add_argument("--torch-threads", type=positive_threads, default=None, metavar="N",
                        help="torch (OpenMP) threads per engine (default: torch's, one per CPU "
                        "or $OMP_NUM_THREADS); the engines' idle OpenMP workers sleep "
                        "(OMP_WAIT_POLICY=PASSIVE unless set): docs/serving.md, 'CPU threads'")
    parser.add_argument("--host", default="127.0.0.1", help="address every member binds")
    parser.add_argument("--port", type=int, default=None, help="router port (default: a free one)")
    parser.add_argument("--api-key", default=None,
                        help="required by the router and engines (visible on a command line: "
                        "prefer --api-key-file or $RELAYKV_API_KEY)")
    parser.add_argument("--api-key-file", default=None,
                        help="file (mode 0600) holding the API key (default $RELAYKV_API_KEY_FILE)")
    parser.add_argument("--kv-secret-file", default=None,
                        help="the cluster's KV transfer secret (mode 0600); default: a fresh "
                        "one in a private temp dir, removed when `up` exits")
    parser.add_argument("--max-restarts", type=int, default=5,
                        help="a member that dies more often than this within --restart-window "
                        "stops the cluster (default 5)")
    parser.add_argument("--restart-window", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--drain-timeout", type=float, default=60.0,
                        help="on SIGTERM, seconds in-flight requests may take to finish "
                        "(default 60)")
    parser.add_argument("--prefill-timeout", type=float, default=120.0,
                        help="the router's deadline for one prefill call before it tries "
                        "another prefill engine (default 120)")
    parser.add_argument("--log-dir", default=None,
                        help="member logs (default: a temp dir, removed when every member "
                        "exited 0, kept and named otherwise)")
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
    try:
        policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)
    except ValueError as exc:
        parser.error(f"argument --max-restarts/--restart-window: {exc}")
    if args.drain_timeout < 0:
        parser.error("argument --drain-timeout: must be >= 0")
    conditional_rule(args, parser)  # a bad value exits here, before anything starts
    try:
        api_key = resolve_api_key(args.api_key, args.api_key_file)
    except PrivateFileError as exc:
        parser.error(f"argument --api-key-file: {exc}")
    if args.kv_secret_file:
        try:
            load_kv_secret(args.kv_secret_file)
        except ValueError as exc:
            parser.error(f"argument --kv-secret-file: {exc}")
    with _stop_on_signals() as stop:  # from here on a signal is a stop, never a death
        reap_stale()  # what an `up` killed with SIGKILL left
        run_dir = RunDir.create()
        try:
            secret_file = args.kv_secret_file or str(new_kv_secret(run_dir.path / "kv-secret"))
            env = {KV_SECRET_ENV: str(Path(secret_file).resolve())}
            if api_key:
                env[API_KEY_ENV] = api_key  # members read it from the environment, not argv
            return _run_cluster(args, engine_extra, env, policy, run_dir.path, stop)
        finally:
            run_dir.remove()


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT, SIGTERM and SIGHUP (unless ignored, as under nohup) while in
    the block; the previous handlers afterwards."""
    stop = threading.Event()
    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in signals}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_cluster(
    args: argparse.Namespace,
    engine_extra: list[str],
    env: dict[str, str],
    policy: RestartPolicy,
    run_dir: Path,
    stop: threading.Event,
) -> int:
    common = ["--model", args.model, "--pd-policy", args.pd_policy,
              "--kv-transport", args.kv_transport, *engine_extra]
    given = {flag.split("=")[0] for flag in engine_extra}
    if args.disaggregation != "always" and "--sibling-reach" not in given:
        common += ["--sibling-reach", str(default_sibling_reach(args.conditional_max_suffix))]
    if args.torch_threads is not None:
        common += ["--torch-threads", str(args.torch_threads)]
    store = None
    if args.kv_offloading_backend is not None:
        common += ["--kv-offloading-backend", args.kv_offloading_backend]
        if "--kv-offloading-size" not in given:
            common += ["--kv-offloading-size", str(DEFAULT_STORE_GIB)]
    if args.kv_offloading_backend == "mooncake":
        from relaykv.serve.assembly.tier_wiring import store_master_member  # (imports torch)

        argv, address, health = store_master_member(args.host)
        common += ["--kv-store-master", address]
        store = (argv, health)
    # Co-located engines must not spin OpenMP workers on each other's cores
    # (serve/assembly/cpu_threads.py).
    env = {**colocated_engine_env(os.environ), **env}
    cluster = Cluster(
        engine_args=common,
        router_args=["--drain-timeout", str(args.drain_timeout), "--routing", args.routing,
                     "--prefill-timeout", str(args.prefill_timeout),
                     "--disaggregation", args.disaggregation,
                     "--conditional-max-suffix", str(args.conditional_max_suffix),
                     *([] if args.conditional_max_queued_prefill is None else
                       ["--conditional-max-queued-prefill",
                        str(args.conditional_max_queued_prefill)]),
                     "--conditional-max-running", str(args.conditional_max_running)],
        kv_events=args.routing == "cache-aware", num_prefill=args.num_prefill,
        num_decode=args.num_decode, host=args.host, router_port=args.port,
        log_dir=Path(args.log_dir) if args.log_dir else None, env=env, run_dir=run_dir,
        store=store,
    )
    try:
        cluster.plan()
    except ClusterError as exc:
        print(f"[relaykv up] {exc}", file=sys.stderr, flush=True)
        if args.log_dir is None and cluster.log_dir is not None:
            shutil.rmtree(cluster.log_dir, ignore_errors=True)  # empty: nothing was started
        return 1

    def say(message: str) -> None:
        print(f"[relaykv up] {message}", file=sys.stderr, flush=True)

    say(f"starting {args.num_prefill} prefill + {args.num_decode} decode engines ({args.model}, "
        f"--pd-policy {args.pd_policy}, --kv-transport {args.kv_transport}) and a router"
        f"{', after a Mooncake Store master' if store is not None else ''}; "
        f"logs in {cluster.log_dir}")
    clean_stale_shared_memory()
    codes: dict[str, int] | None = None
    try:
        codes = _serve(cluster, args, policy, say, stop)
    finally:
        cluster.stop(router_timeout=args.drain_timeout + 15)  # whatever still runs (an error)
        clean_stale_shared_memory()
        if args.log_dir is None:
            assert cluster.log_dir is not None
            if codes is not None and all(code == 0 for code in codes.values()):
                shutil.rmtree(cluster.log_dir, ignore_errors=True)
            else:
                say(f"logs kept in {cluster.log_dir}")
    if codes is None:
        return 1
    bad = {name: code for name, code in codes.items() if code != 0}
    say("every member exited 0" if not bad else f"members exited non-zero: {bad}")
    return 0


def _serve(
    cluster: Cluster,
    args: argparse.Namespace,
    policy: RestartPolicy,
    say: Callable[[str], None],
    stop: threading.Event,
) -> dict[str, int] | None:
    """Start the cluster, supervise it until `stop`, then drain it in order: each member's
    exit status; None when it failed to start (stopped then) or crash-looped."""
    try:
        cluster.start(timeout=args.startup_timeout, progress=say, cancelled=stop.is_set)
    except ClusterError as exc:
        say(str(exc))
        return None
    info = cluster.describe()
    if args.json:
        print(json.dumps(info), flush=True)
    else:
        print(f"router  {info['router']}\nprefill {' '.join(cluster.urls('prefill'))}\n"
              f"decode  {' '.join(cluster.urls('decode'))}\n(Ctrl-C stops the cluster)", flush=True)
    supervisor = Supervisor(cluster, policy, say, on_death=clean_stale_shared_memory)
    while not stop.wait(0.5):
        reason = supervisor.poll()
        if reason is not None:
            say(f"{reason}\nstopping the cluster")
            return None
    say("stopping: router first (in-flight requests finish), then prefill, then decode")
    return cluster.stop(router_timeout=args.drain_timeout + 15)
