"""The "where are my blocks" descriptor P hands to the router and D uses to read.

It names the serving endpoint (engine id, host, control port, transport) and the page
layout the endpoint serves; `meta` carries transport-specific registration data. It is
plain data: msgspec encodes it to JSON for the router's HTTP hop and to msgpack for ZMQ.
No pickle anywhere (docs/architecture.md: "typed, no pickle on the wire").
"""

from __future__ import annotations

from typing import Any

import msgspec

from relaykv.transfer.transport.layout import PageLayout

PROTOCOL_VERSION = 1


class KVSourceDescriptor(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Where a serving endpoint is and what it serves.

    `layout` is `[num_blocks, block_bytes, page_bytes_g0, page_bytes_g1, ...]`.
    `meta` is transport-specific (empty for the push transports here: P never publishes
    its memory registration, see docs/transports.md).
    """

    engine_id: str
    transport: str
    host: str
    port: int
    layout: list[int]
    meta: dict[str, str] = {}
    protocol: int = PROTOCOL_VERSION

    @property
    def endpoint(self) -> str:
        """The ZeroMQ address of the control socket."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    @property
    def page_layout(self) -> PageLayout:
        return PageLayout.from_wire(self.layout)

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> KVSourceDescriptor:
        return _validated(msgspec.json.decode(data, type=cls))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVSourceDescriptor:
        return _validated(msgspec.convert(data, type=cls))


def _validated(desc: KVSourceDescriptor) -> KVSourceDescriptor:
    if desc.protocol != PROTOCOL_VERSION:
        raise ValueError(
            f"descriptor protocol {desc.protocol} != supported {PROTOCOL_VERSION} "
            f"(engine {desc.engine_id!r})"
        )
    if not 0 < desc.port < 65536:
        raise ValueError(f"descriptor port {desc.port} out of range")
    desc.page_layout  # noqa: B018 - raises ValueError on a malformed layout
    return desc
