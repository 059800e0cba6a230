"""`--kv-transport` names -> transports, plus the CLI flags every engine command shares."""

from __future__ import annotations

import argparse
import os

from relaykv.common.plumbing.lazy_entries import resolve
from relaykv.transfer.transport.base import KVTransport, TransportOptions
from relaykv.transfer.transport.wire.auth import SECRET_ENV, SecretError, load_secret_file

DEFAULT_TRANSPORT = "shm"

# name -> "module:Class"; imported on use so a missing optional library (nixl, mooncake)
# never breaks the others.
_TRANSPORTS: dict[str, str] = {
    "shm": "relaykv.transfer.transport.planes.shm:ShmTransport",
    "tcp": "relaykv.transfer.transport.planes.tcp:TcpTransport",
    "nixl": "relaykv.transfer.transport.planes.nixl:NixlTransport",
    "mooncake": "relaykv.transfer.transport.planes.mooncake:MooncakeTransport",
}
TRANSPORT_NAMES: tuple[str, ...] = tuple(_TRANSPORTS)


def transport_class(name: str) -> type[KVTransport]:
    cls: type[KVTransport] = resolve(_TRANSPORTS, name, "KV transport")
    return cls


def get_transport(name: str) -> KVTransport:
    """An instance of the transport called `name` (raises TransportUnavailable if its
    library is missing; the message says how to install it)."""
    cls = transport_class(name)
    cls.require()
    return cls()


def availability() -> dict[str, str | None]:
    """name -> None if usable here, else the reason."""
    return {name: transport_class(name).availability() for name in TRANSPORT_NAMES}


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    """The KV transfer flags shared by engine commands."""
    group = parser.add_argument_group("KV transfer")
    group.add_argument(
        "--kv-transport",
        choices=TRANSPORT_NAMES,
        default=DEFAULT_TRANSPORT,
        help="how KV pages move between prefill and decode engines "
        f"(default {DEFAULT_TRANSPORT}: same host)",
    )
    group.add_argument(
        "--kv-transfer-host",
        default="127.0.0.1",
        help="address the KV transfer endpoint binds and advertises "
        "(a routable address for two hosts; default 127.0.0.1)",
    )
    group.add_argument(
        "--kv-transfer-port",
        type=int,
        default=0,
        help="control port of the serving endpoint (default 0: any free port)",
    )
    group.add_argument(
        "--kv-secret-file",
        default=os.environ.get(SECRET_ENV) or None,
        help="file (mode 0600) holding the cluster's KV transfer secret, which authenticates "
        f"every transfer message and signs grants (default ${SECRET_ENV}; `relaykv up` "
        "makes one; two hosts share one file)",
    )
    group.add_argument(
        "--kv-transfer-timeout",
        type=float,
        default=30.0,
        help="seconds before a KV read fails (default 30)",
    )
    group.add_argument(
        "--kv-link-gbps",
        type=float,
        default=None,
        metavar="G",
        help="tcp only: pace P's page sends like a G Gbit/s link between two hosts "
        "(experiments on one machine; default: unpaced)",
    )


def options_from_args(args: argparse.Namespace) -> TransportOptions:
    """TransportOptions from the flags above; ValueError names the bad flag."""
    if not 0 <= args.kv_transfer_port < 65536:
        raise ValueError(f"--kv-transfer-port must be in 0..65535, got {args.kv_transfer_port}")
    if args.kv_transfer_timeout <= 0:
        raise ValueError(f"--kv-transfer-timeout must be > 0, got {args.kv_transfer_timeout}")
    link = getattr(args, "kv_link_gbps", None)
    if link is not None:
        if not link > 0:
            raise ValueError(f"--kv-link-gbps must be > 0, got {link}")
        if getattr(args, "kv_transport", "tcp") != "tcp":
            raise ValueError(
                f"--kv-link-gbps paces the tcp transport only, not --kv-transport "
                f"{args.kv_transport}"
            )
    secret_file = getattr(args, "kv_secret_file", None)
    if secret_file:
        try:
            secret = load_secret_file(secret_file)
        except SecretError as exc:
            raise ValueError(f"--kv-secret-file is unusable: {exc}") from None
    else:
        secret = None  # this process's own (library and test use; see wire/auth.py)
    return TransportOptions(
        secret=secret,
        link_gbps=link,
        host=args.kv_transfer_host,
        port=args.kv_transfer_port,
        timeout_s=args.kv_transfer_timeout,
        connect_timeout_s=min(5.0, args.kv_transfer_timeout),
        idle_timeout_s=min(5.0, args.kv_transfer_timeout),
    )
