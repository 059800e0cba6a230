"""`relaykv serve`: an OpenAI-compatible HTTP server for one engine (docs/serving.md)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from relaykv.common.plumbing.secret_files import (
    API_KEY_ENV,
    API_KEY_FILE_ENV,
    PrivateFileError,
    resolve_api_key,
)
from relaykv.engine.kv_events_config import KVEventsConfigError, parse_kv_events_config
from relaykv.serve.assembly.cpu_threads import (
    OMP_ENV,
    WAIT_POLICY_ENV,
    apply_torch_threads,
    positive_threads,
)
from relaykv.serve.assembly.options import (
    OptionError,
    add_engine_arguments,
    add_pd_arguments,
    engine_options,
)
from relaykv.serve.sglang import bootstrap as sglang_bootstrap

if TYPE_CHECKING:
    from fastapi import FastAPI

    from relaykv.engine.kv_events import ZmqEventPublisher as Publisher
    from relaykv.engine.kv_events_config import KVEventsConfig
    from relaykv.serve.assembly.engine_factory import ServedEngine

log = logging.getLogger("relaykv.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_pd_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    server.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default ${API_KEY_ENV}); "
        "visible to every local user on a command line: prefer --api-key-file",
    )
    server.add_argument(
        "--api-key-file",
        default=None,
        help=f"file (mode 0600) holding the API key (default ${API_KEY_FILE_ENV})",
    )
    server.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients use (default: the model's name)",
    )
    server.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests may finish after SIGTERM before they are aborted",
    )
    server.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    server.add_argument("--access-log", action="store_true", help="log every HTTP request")
    server.add_argument(
        "--torch-threads",
        type=positive_threads,
        default=None,
        metavar="N",
        help=f"torch (OpenMP) threads for this engine (default: torch's, ${OMP_ENV} or one per "
        "CPU); engines sharing a host should split its CPUs (docs/serving.md, 'CPU threads')",
    )
    server.add_argument(
        "--kv-events-config",
        default=None,
        help="KV cache events as vLLM publishes them, a JSON object with vLLM's keys, e.g. "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq"}\' (docs/kv-events.md)',
    )
    sglang_bootstrap.add_arguments(parser)


def say(line: str) -> None:
    """Startup facts go to stdout (people, launchers) and to the log (log collectors)."""
    print(f"relaykv serve: {line}", flush=True)
    log.info(line)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not 0 <= args.port <= 65535:
        parser.error(f"argument --port: must be in 0..65535, got {args.port}")
    if args.drain_timeout < 0:
        parser.error(f"argument --drain-timeout: must be >= 0, got {args.drain_timeout}")
    if args.served_model_name is not None and not args.served_model_name.strip():
        parser.error("argument --served-model-name: must not be empty")
    try:
        api_key = resolve_api_key(args.api_key, args.api_key_file)
    except PrivateFileError as exc:
        parser.error(f"argument --api-key-file: {exc}")
    try:
        options = engine_options(args)
        events_config = parse_kv_events_config(args.kv_events_config)
        bootstrap = sglang_bootstrap.config_from_args(args, options.role, options.kv_lease_seconds)
    except (OptionError, KVEventsConfigError) as exc:
        parser.error(str(exc))
    except ValueError as exc:  # the --sglang-bootstrap flags
        parser.error(str(exc))
    events_secret = _events_secret(events_config, args, parser)
    from relaykv.serve.api.app import create_app
    from relaykv.serve.api.server import serve_app
    from relaykv.serve.assembly.engine_factory import build_engine
    from relaykv.serve.assembly.pd_wiring import (
        connector_factory,
        finish_process,
        kv_buffer_factory,
    )

    apply_torch_threads(args.torch_threads)
    try:
        factory = connector_factory(options, args)
        served = build_engine(
            options, connector_factory=factory, kv_buffer=kv_buffer_factory(options)
        )
    except OptionError as exc:
        parser.error(str(exc))
    for line in served.summary:
        say(line)
    say(f"API key: {'required on /v1/*' if api_key else 'none (/v1/* is open)'}")
    policy = os.environ.get(WAIT_POLICY_ENV)
    say(f"torch threads: {_torch_threads()}" + (f" ({WAIT_POLICY_ENV}={policy})" if policy else ""))
    app = create_app(served, api_key=api_key, drain_timeout=args.drain_timeout)
    sglang_bootstrap.install(app, bootstrap)
    publisher = start_kv_events(served, events_config, app, events_secret)
    try:
        status = serve_app(
            app,
            args.host,
            args.port,
            log_level=args.log_level,
            access_log=args.access_log,
            on_ready=lambda url: say(f"listening on {url} (model {served.served_model_name!r})"),
        )
    finally:
        if publisher is not None:
            publisher.shutdown()
    return finish_process(options, status)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _events_secret(
    config: KVEventsConfig, args: argparse.Namespace, parser: argparse.ArgumentParser
) -> bytes | None:
    """The cluster secret when the KV event stream leaves the host (CURVE), else None."""
    if not (config.active and config.curve):
        return None
    path = getattr(args, "kv_secret_file", None)
    if not path:
        parser.error(
            "argument --kv-events-config: an endpoint off this host is encrypted and "
            "authenticated with the cluster secret: give --kv-secret-file (or bind loopback "
            "or ipc://; docs/kv-events.md)"
        )
    from relaykv.serve.assembly.pd_wiring import load_kv_secret

    try:
        return load_kv_secret(path)
    except ValueError as exc:
        parser.error(f"argument --kv-secret-file: {exc}")


def start_kv_events(
    served: ServedEngine, config: KVEventsConfig, app: FastAPI, secret: bytes | None = None
) -> Publisher | None:
    """Publish the engine's KV events when configured; serve `/v1/kv_cache_info` always."""
    from relaykv.engine.kv_events import ZmqEventPublisher
    from relaykv.serve.api.kv_cache_info import install_kv_cache_info

    publisher = None
    if config.active:
        publisher = ZmqEventPublisher(config, served.engine.manager.geometry, secret=secret)
        served.engine.manager.set_event_sink(publisher.sink)
        say(
            f"KV events on {publisher.endpoint} (topic {config.topic!r}, replay "
            f"{publisher.replay_endpoint or 'off'}"
            f"{'; CURVE with the cluster secret' if secret else ''})"
        )
    install_kv_cache_info(app, served, publisher)
    return publisher
