"""`--kv-offloading-backend` names -> tier backend factories (docs/tier.md).

A backend registers `name -> "module:function"`, imported on use so a missing optional
library never breaks the others; the function takes a `TierRequest` and returns a
`relaykv.kvcache.tier.TierBackend`.
"""

from __future__ import annotations

from relaykv.common.plumbing.lazy_entries import resolve
from relaykv.kvcache.tier import TierBackend
from relaykv.transfer.tier.base import TierFactory, TierRequest

DEFAULT_BACKEND = "native"

_BACKENDS: dict[str, str] = {
    "native": "relaykv.transfer.tier.host:host_tier",
    "mooncake": "relaykv.transfer.tier.mooncake:mooncake_tier",  # shared: Mooncake Store
}


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def register(name: str, target: str) -> None:
    """Add a backend: `target` is "module:function" (a `TierFactory`)."""
    _BACKENDS[name] = target


def factory(name: str) -> TierFactory:
    made: TierFactory = resolve(_BACKENDS, name, "KV offloading backend")
    return made


def build_backend(name: str, request: TierRequest) -> TierBackend:
    return factory(name)(request)
