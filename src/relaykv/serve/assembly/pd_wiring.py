"""Turning `--role prefill|decode` and the KV transfer flags into a P/D connector.

The connector is built over the engine's cache manager and the model runner's KV page buffer
(`relaykv.transfer.PDConnector`); the engine factory calls the function returned here once the
engine exists. `finish_process` ends a server process whose transport's libraries crash at
exit (nixl).
"""

from __future__ import annotations

import argparse
import atexit
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from relaykv.engine import KVConnector, LLMEngine
from relaykv.kvcache import Geometry
from relaykv.serve.assembly.engine_factory import ConnectorFactory
from relaykv.serve.assembly.options import EngineOptions, OptionError
from relaykv.transfer.connector import PDConnector
from relaykv.transfer.transport import TransportUnavailable, get_transport, options_from_args
from relaykv.transfer.transport.wire.auth import SECRET_ENV, load_secret_file, write_secret_file

_SHARED_SEGMENTS: list[Any] = []


def connector_factory(options: EngineOptions, args: argparse.Namespace) -> ConnectorFactory | None:
    """A factory for the engine's connector, or None for a colocated engine.

    Transport problems (a bad flag, a library that is not installed) are raised here, before
    the model loads, as `OptionError`s naming the flag.
    """
    if options.role == "colocated":
        return None
    if not getattr(args, "kv_secret_file", None):
        raise OptionError(
            "--kv-secret-file",
            "prefill and decode engines need the cluster's KV transfer secret (a 0600 file; "
            "`relaykv up` makes one, or set $RELAYKV_KV_SECRET_FILE; docs/security.md)",
        )
    try:
        transport_options = options_from_args(args)
    except ValueError as exc:
        flag = str(exc).split()[0]
        raise OptionError(flag, str(exc).split(" ", 1)[1]) from None
    transport = get_transport(options.kv_transport)
    try:
        transport.require()
    except TransportUnavailable as exc:
        raise OptionError("--kv-transport", str(exc)) from None
    engine_id = f"{options.role}-{socket.gethostname()}-{os.getpid()}"

    def build(engine: LLMEngine) -> KVConnector:
        return PDConnector(
            options.role,
            engine.manager,
            transport,
            engine.executor.kv_buffer,  # the executor's KV pages (the Executor protocol)
            engine_id=engine_id,
            options=transport_options,
            lease_seconds=options.kv_lease_seconds,
        )

    return build


def kv_buffer_factory(options: EngineOptions) -> Callable[[Geometry, int], Any] | None:
    """A decode engine on the shm transport keeps its KV pages in shared memory, so the
    prefill engine writes received pages straight into them (shm direct mode: one copy
    instead of two, docs/transports.md)."""
    if options.role != "decode" or options.kv_transport != "shm":
        return None
    import torch

    from relaykv.transfer.transport import PageLayout
    from relaykv.transfer.transport.planes.shm import SharedKVBuffer

    def allocate(geometry: Geometry, num_blocks: int) -> Any:
        shared = SharedKVBuffer(PageLayout.from_geometry(geometry, num_blocks))
        # The segment must outlive the engine's build (its name is what P opens): a server
        # process keeps it until exit.
        _SHARED_SEGMENTS.append(shared)
        return torch.from_numpy(shared.array)

    return allocate


def finish_process(options: EngineOptions, status: int) -> int:
    """`status`, for the process to exit with as usual; or, when its KV transport loaded a
    library that crashes in the C runtime's exit-time destructors
    (`KVTransport.skips_library_destructors`: nixl), the end of the process here: what a
    normal exit does first (stop thread pools, join the non-daemon threads: CPython's
    `threading._shutdown`; run the `atexit` handlers), the standard streams flushed, then
    `os._exit(status)`. Call it last, from a process's main, after every transport is
    closed."""
    if options.role == "colocated":
        return status
    if not get_transport(options.kv_transport).skips_library_destructors():
        return status
    getattr(threading, "_shutdown")()  # noqa: B009 (private: not in the type stubs)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# What `relaykv up` (the launch layer) needs of the transfer layer, re-exported here because
# launch may import serve but not transfer (tools/check_layers.py).
KV_SECRET_ENV = SECRET_ENV
load_kv_secret = load_secret_file
new_kv_secret = write_secret_file


def clean_stale_shared_memory() -> list[str]:
    """Remove this user's relaykv shared-memory files whose creating process is dead."""
    from relaykv.transfer.transport.planes.shm_files import clean_stale_files

    return clean_stale_files()
