"""The transport contract: what every `--kv-transport` provides.

A `KVTransport` makes the two ends of a P/D KV transfer over one KV page buffer
(docs/transports.md: uint8 `[num_blocks, block_bytes]`, pages addressed by
(group, block id), block 0 never transferred):

* `create_server(...)` -> `TransferServer` on P: a background thread with a ZeroMQ
  control socket; `descriptor` is what P returns to the router; `allow` / `extend` /
  `release` say which blocks of which request a reader may have; `events()` reports
  verified reads and expired leases; `inject(FaultPlan)` breaks things on purpose.
* `create_client(...)` -> `TransferClient` on D: `start_read(descriptor, request_id,
  pages)` returns a handle at once (poll `handle.done()` from the step loop, or
  `client.completed()`); `read(...)` blocks.

Safety rules (every transport; tests/transfer/ checks each):
1. Only allowed pages leave P: a read naming an unknown/released/expired request, a
   block outside its allowed set, or a wrong page size is refused before any byte moves.
   P pushes bytes to D after validating (push on request); D never gets an address or
   key for P's memory.
2. Every page is verified on D over the destination bytes (xxh3-64 computed by P over
   the source). Mismatch -> IntegrityError; fewer pages than asked -> ShortTransferError.
   After any failure the destination pages are garbage.
3. No waiting without a deadline: every read ends within its timeout (TransferTimeout,
   PeerUnreachable, PeerLost at worst), and P keeps serving other readers.
4. `release(request_id)` returns only once no copy of that request's pages is running,
   so P may reuse the blocks right after.
5. Control messages are msgspec structs over ZeroMQ; nothing is pickled. Sockets bind
   127.0.0.1 unless a host is given. Every message carries an HMAC under the cluster
   secret (wire/auth.py); P writes only into memory its reader registered
   (serving/registrations.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import zmq

from relaykv.transfer.transport.errors import TransportUnavailable
from relaykv.transfer.transport.layout import PageLayout, as_page_array
from relaykv.transfer.transport.planes.base import ReceiverPlane, SenderPlane
from relaykv.transfer.transport.reading.client import TransferClient
from relaykv.transfer.transport.serving.server import TransferServer


@dataclass(frozen=True, slots=True)
class TransportOptions:
    """Knobs shared by all transports (CLI: see `add_transport_arguments`).

    host: address this end binds and advertises (127.0.0.1; a routable address for two
    hosts). port: P's control port (0: pick a free one). timeout_s: default per-read
    timeout. connect_timeout_s: how long D waits for a connection before
    PeerUnreachable. chunk_bytes: pages per chunk up to this many bytes. window: chunks
    in flight per transfer. staging_bytes: shm only, D's staging area size. secret: the
    cluster secret every message is authenticated with (docs/security.md).
    """

    host: str = "127.0.0.1"
    port: int = 0
    timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    idle_timeout_s: float = 5.0  # a read hearing nothing from P this long fails (hung P)
    chunk_bytes: int = 4 << 20
    window: int = 4
    staging_bytes: int = 64 << 20
    link_gbps: float | None = None
    # The cluster secret (wire/auth.py); None: $RELAYKV_KV_SECRET_FILE's, else this process's own.
    secret: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")
        if self.chunk_bytes < 1 or self.window < 1 or self.staging_bytes < 1:
            raise ValueError("chunk_bytes, window and staging_bytes must be >= 1")
        if self.link_gbps is not None and not self.link_gbps > 0:
            raise ValueError(f"link_gbps must be > 0, got {self.link_gbps}")


class KVTransport(ABC):
    """A named way to move KV pages; subclasses supply the data planes."""

    name: ClassVar[str]
    summary: ClassVar[str]

    @classmethod
    def availability(cls) -> str | None:
        """None if usable here, else why not (a missing library, with the fix)."""
        return None

    @classmethod
    def require(cls) -> None:
        reason = cls.availability()
        if reason is not None:
            raise TransportUnavailable(f"--kv-transport {cls.name}: {reason}")

    @classmethod
    def skips_library_destructors(cls) -> bool:
        """Whether this process, having used the transport, must end without the C
        libraries' exit-time destructors (one of its libraries crashes in them):
        `relaykv serve` then runs Python's exit handlers and ends with `os._exit`."""
        return False

    @abstractmethod
    def sender_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> SenderPlane: ...

    @abstractmethod
    def receiver_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> ReceiverPlane: ...

    def create_server(
        self,
        buffer: Any,
        layout: PageLayout,
        *,
        engine_id: str,
        options: TransportOptions | None = None,
        context: zmq.Context | None = None,
        start: bool = True,
    ) -> TransferServer:
        """P's serving endpoint over `buffer` (a torch uint8 tensor or numpy array)."""
        self.require()
        options = options or TransportOptions()
        array = as_page_array(buffer, layout)
        server = TransferServer(
            transport=self.name,
            plane=self.sender_plane(array, layout, options),
            buffer=array,
            layout=layout,
            engine_id=engine_id,
            host=options.host,
            port=options.port,
            chunk_bytes=options.chunk_bytes,
            context=context,
            secret=options.secret,
        )
        return server.start() if start else server

    def create_client(
        self,
        buffer: Any,
        layout: PageLayout,
        *,
        engine_id: str,
        options: TransportOptions | None = None,
        context: zmq.Context | None = None,
    ) -> TransferClient:
        """D's reader writing into `buffer`."""
        self.require()
        options = options or TransportOptions()
        array = as_page_array(buffer, layout)
        return TransferClient(
            transport=self.name,
            plane=self.receiver_plane(array, layout, options),
            buffer=array,
            layout=layout,
            engine_id=engine_id,
            timeout_s=options.timeout_s,
            connect_timeout_s=options.connect_timeout_s,
            idle_timeout_s=options.idle_timeout_s,
            window=options.window,
            context=context,
            secret=options.secret,
        )
