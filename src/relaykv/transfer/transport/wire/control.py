"""Control messages between a reader (D) and a serving endpoint (P), over ZeroMQ.

Typed msgspec structs encoded as msgpack; a tagged union so each side decodes exactly
the messages it accepts. Page bytes travel outside these headers: as extra ZeroMQ frames
(tcp), in a shared-memory staging slot (shm) or written by the RDMA-style engine (nixl,
mooncake).

Every message travels as two frames, `[HMAC-SHA256 tag, msgpack]` (auth.py: the tag proves
the sender holds the cluster secret; anything else is dropped unread), then any page frames.

Once per connection D registers where P may write (its shm file, NIXL agent or Mooncake
buffer, and its row count): P keeps that registration per reader engine and never takes a
destination from a Read again (docs/security.md).

    D -> P  Register(reader, registration)

Conversation of one transfer (D's DEALER <-> P's ROUTER):

    D -> P  Read(transfer_id, request_id, pages, sink, window, timeout_s, reader, issued_at)
    P -> D  Refused(reason)                        nothing copied, end
    P -> D  Chunk(index, first_page, digests, ...)  up to `window` unacknowledged
    D -> P  Credit(index)                           D consumed chunk `index`
    P -> D  Done(num_pages) | Failed(reason)
    D -> P  Ack(ok, code, reason)                   D's verdict, for P's bookkeeping
    D -> P  Cancel                                  D gave up (timeout); P stops

Outside a transfer: D -> P Release(request_id) when D will never read a request's pages
(it reused everything locally, or the request ended first), so P frees them before the
lease runs out; D -> P KeepAlive(request_id) while a request still waits for admission on D,
so P extends its lease instead of freeing pages D is about to read. Both name the sender;
P ignores them for a grant bound to another engine (a D holding a grant meant for another D
cannot end it).
"""

from __future__ import annotations

import msgspec

from relaykv.transfer.transport.wire.auth import TO_CLIENT, TO_SERVER, MessageAuth

Page = tuple[int, int, int, int]  # (group, src block, dst block, nbytes)


class Register(msgspec.Struct, tag="register", frozen=True):
    reader: str  # D's engine id
    registration: bytes  # transport-specific: D's destination memory (msgpack of a struct)


class Read(msgspec.Struct, tag="read", frozen=True):
    transfer_id: str
    request_id: str
    pages: list[Page]
    sink: bytes  # transport-specific, per transfer (shm staging: the slots lent to it)
    window: int
    timeout_s: float
    reader: str = ""  # D's engine id: the registration P writes into
    issued_at: float = 0.0  # D's wall clock; P refuses stale (replayed) reads


class Credit(msgspec.Struct, tag="credit", frozen=True):
    transfer_id: str
    index: int


class Cancel(msgspec.Struct, tag="cancel", frozen=True):
    transfer_id: str


class Ack(msgspec.Struct, tag="ack", frozen=True):
    transfer_id: str
    ok: bool
    code: str = ""
    reason: str = ""


class Release(msgspec.Struct, tag="release", frozen=True):
    request_id: str
    reader: str = ""  # D's engine id: only the engine a grant is bound to may end it


class KeepAlive(msgspec.Struct, tag="keepalive", frozen=True):
    request_id: str
    reader: str = ""


class Refused(msgspec.Struct, tag="refused", frozen=True):
    transfer_id: str
    code: str
    reason: str


class Chunk(msgspec.Struct, tag="chunk", frozen=True):
    """Pages `[first_page, first_page + len(digests))` of the Read's page list landed
    (or, for tcp, follow as frames; for shm, sit in staging slot `slot`)."""

    transfer_id: str
    index: int
    first_page: int
    digests: list[int]
    slot: int = -1


class Done(msgspec.Struct, tag="done", frozen=True):
    transfer_id: str
    num_pages: int  # pages the sender claims to have sent


class Failed(msgspec.Struct, tag="failed", frozen=True):
    transfer_id: str
    code: str
    reason: str


ToServer = Register | Read | Credit | Cancel | Ack | Release | KeepAlive
ToClient = Refused | Chunk | Done | Failed


class Unauthenticated(ValueError):
    """A message without a valid tag: not from a holder of the cluster secret."""


class Codec:
    """Per-thread encoder/decoders with the message tags (msgspec objects are used from one
    thread each)."""

    def __init__(self, auth: MessageAuth) -> None:
        self._auth = auth
        self._enc = msgspec.msgpack.Encoder()
        self._to_server = msgspec.msgpack.Decoder(ToServer)
        self._to_client = msgspec.msgpack.Decoder(ToClient)

    def to_server(self, msg: msgspec.Struct) -> list[bytes]:
        payload = self._enc.encode(msg)
        return [self._auth.tag(TO_SERVER, payload), payload]

    def to_client(self, msg: msgspec.Struct) -> list[bytes]:
        payload = self._enc.encode(msg)
        return [self._auth.tag(TO_CLIENT, payload), payload]

    def decode_to_server(self, tag: bytes | memoryview, data: bytes | memoryview) -> ToServer:
        if not self._auth.check(TO_SERVER, data, tag):
            raise Unauthenticated("message tag does not match the cluster secret")
        return self._to_server.decode(data)

    def decode_to_client(self, tag: bytes | memoryview, data: bytes | memoryview) -> ToClient:
        if not self._auth.check(TO_CLIENT, data, tag):
            raise Unauthenticated("message tag does not match the cluster secret")
        return self._to_client.decode(data)
