"""`--kv-offloading-*` flags -> the engine's KV tier backend (docs/tier.md).

The tier holds `--kv-offloading-size` GiB // block_bytes blocks of the executor's page
memory; the backend named by `--kv-offloading-backend` is built over `executor.kv_buffer`
through `relaykv.transfer.tier.registry`. Bad values raise `OptionError` naming the flag.
`mooncake` also gets its master (`--kv-store-master`), the cluster secret and a namespace
(the served model and its dtype; the factory adds the KV layout) in `settings`.
"""

from __future__ import annotations

from typing import Any

from relaykv.engine import Executor
from relaykv.kvcache.tier import TierBackend
from relaykv.serve.assembly.options import EngineOptions, OptionError
from relaykv.transfer.tier.base import TierRequest
from relaykv.transfer.tier.registry import factory

GIB = 1 << 30


def tier_blocks(size_gib: float, block_bytes: int) -> int:
    """Blocks a tier of `size_gib` GiB holds (raises OptionError below one block)."""
    blocks = int(size_gib * GIB) // block_bytes
    if blocks < 1:
        raise OptionError(
            "--kv-offloading-size",
            f"{size_gib} GiB holds no block of {block_bytes} bytes",
        )
    return blocks


def build_tier(options: EngineOptions, executor: Executor, model_name: str = "") -> TierBackend:
    assert options.kv_offloading_size is not None
    try:
        make = factory(options.kv_offloading_backend)
    except ValueError as exc:
        raise OptionError("--kv-offloading-backend", str(exc)) from None
    if executor.kv_buffer is None:
        raise OptionError("--kv-offloading-size", "this executor has no KV pages to offload")
    geometry = executor.geometry
    capacity = tier_blocks(options.kv_offloading_size, geometry.block_bytes)
    settings = _store_settings(options, model_name) if options.kv_store_master else {}
    try:
        return make(TierRequest(executor.kv_buffer, geometry, capacity, settings))
    except ConnectionError as exc:
        raise OptionError("--kv-store-master", str(exc)) from None


def _store_settings(options: EngineOptions, model_name: str) -> dict[str, Any]:
    from relaykv.transfer.tier.mooncake import mooncake_unavailable
    from relaykv.transfer.transport.wire.auth import SecretError, load_secret_file

    missing = mooncake_unavailable()
    if missing is not None:
        raise OptionError("--kv-offloading-backend", missing)
    assert options.kv_secret_file is not None  # EngineOptions.check
    try:
        secret = load_secret_file(options.kv_secret_file)
    except SecretError as exc:
        raise OptionError("--kv-secret-file", str(exc)) from None
    return {
        "master": options.kv_store_master,
        "secret": secret,
        "namespace": f"{model_name or options.model}|{options.dtype}",
    }


def store_master_member(host: str) -> tuple[list[str], str, str]:
    """For `relaykv up --kv-offloading-backend mooncake`: the local master's argv, the
    address engines get as `--kv-store-master` and its `/health` URL (loopback admin port)."""
    from relaykv.transfer.tier.store_master import MasterPorts, master_argv

    ports = MasterPorts.free(host)
    return master_argv(ports), ports.address, f"http://127.0.0.1:{ports.admin}"
