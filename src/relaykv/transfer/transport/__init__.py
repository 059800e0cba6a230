"""KV transports of the P/D transfer: how pages move (the connector decides which).

The contract sits here: `base.py` (what every transport provides, and its safety rules),
`errors.py`, `descriptor.py` (where P's blocks are), `layout.py` (page addressing) and
`registry.py` (names and CLI flags). The rooms below it: `serving/` (the serving side, P),
`reading/` (the reading side, D), `planes/` (data planes: shm, tcp, nixl, mooncake) and
`wire/` (control messages, sockets, the cluster secret, page digests).
Usage (see docs/transports.md):

    transport = get_transport("shm")
    server = transport.create_server(p_buffer, layout, engine_id="P0")      # on P
    server.allow("req-1", {0: [5, 6], 1: [9]}, time.monotonic() + 30)
    client = transport.create_client(d_buffer, layout, engine_id="D0")      # on D
    handle = client.start_read(server.descriptor, "req-1",
                               [PageCopy(0, 5, 17, layout.page_bytes[0]), ...])
    ... handle.done() from the step loop; handle.result() raises a TransferError ...
"""

from __future__ import annotations

from relaykv.transfer.transport.base import KVTransport, TransportOptions
from relaykv.transfer.transport.descriptor import KVSourceDescriptor
from relaykv.transfer.transport.errors import (
    IntegrityError,
    LeaseExpired,
    PeerLost,
    PeerUnreachable,
    ShortTransferError,
    TransferError,
    TransferRefused,
    TransferTimeout,
    TransportUnavailable,
)
from relaykv.transfer.transport.layout import PageCopy, PageLayout, page_copies
from relaykv.transfer.transport.reading.client import TransferClient, TransferHandle, TransferResult
from relaykv.transfer.transport.registry import (
    DEFAULT_TRANSPORT,
    TRANSPORT_NAMES,
    add_transport_arguments,
    availability,
    get_transport,
    options_from_args,
)
from relaykv.transfer.transport.serving.faults import FaultPlan
from relaykv.transfer.transport.serving.server import ServeEvent, TransferServer

__all__ = [
    "DEFAULT_TRANSPORT",
    "TRANSPORT_NAMES",
    "FaultPlan",
    "IntegrityError",
    "KVSourceDescriptor",
    "KVTransport",
    "LeaseExpired",
    "PageCopy",
    "PageLayout",
    "PeerLost",
    "PeerUnreachable",
    "ServeEvent",
    "ShortTransferError",
    "TransferClient",
    "TransferError",
    "TransferHandle",
    "TransferRefused",
    "TransferResult",
    "TransferServer",
    "TransferTimeout",
    "TransportOptions",
    "TransportUnavailable",
    "add_transport_arguments",
    "availability",
    "get_transport",
    "options_from_args",
    "page_copies",
]
