"""The failures a KV transfer can end with, one class per cause.

Every failure on the reading side (D) is a `TransferError`; the subclass says why. After
any failure the destination pages of that transfer hold garbage: the caller frees them and
publishes nothing (docs/design.md §7: "a failed or timed-out transfer frees its blocks,
publishes nothing").
"""

from __future__ import annotations


class TransferError(RuntimeError):
    """A transfer did not complete; its destination pages are garbage.

    `dst_quiesced` (set by the client): False when a push transport (nixl, mooncake, shm
    direct) failed on D's side (timeout, integrity, lost peer) before P confirmed it had
    stopped; P may then still land a chunk it had in flight. The caller must keep those
    destination blocks out of reuse for a while (the transport's write timeout) or until
    P's `read_failed` event; when True nothing writes them any more.
    """

    code = "failed"
    dst_quiesced = True


class TransferRefused(TransferError):
    """The serving side refused the read (unknown request, block not allowed, released or
    expired lease, page size mismatch). Nothing was copied."""

    code = "refused"


class LeaseExpired(TransferRefused):
    """The request's lease on the serving side ran out before or during the transfer."""

    code = "lease_expired"


class IntegrityError(TransferError):
    """A page arrived with bytes that differ from what the sender hashed."""

    code = "integrity"


class ShortTransferError(TransferError):
    """The sender claimed completion but fewer pages or bytes arrived than were asked for."""

    code = "short"


class TransferTimeout(TransferError):
    """The transfer did not complete within its timeout."""

    code = "timeout"


class PeerUnreachable(TransferError):
    """No connection to the serving endpoint could be made."""

    code = "unreachable"


class PeerLost(TransferError):
    """The connection to the serving endpoint dropped while the transfer was in flight."""

    code = "peer_lost"


class TransportUnavailable(RuntimeError):
    """The transport's library is not importable or not usable on this machine."""


ERRORS_BY_CODE: dict[str, type[TransferError]] = {
    cls.code: cls
    for cls in (
        TransferError,
        TransferRefused,
        LeaseExpired,
        IntegrityError,
        ShortTransferError,
        TransferTimeout,
        PeerUnreachable,
        PeerLost,
    )
}


def error_from_code(code: str, message: str) -> TransferError:
    """Rebuild the error a peer reported by its code (unknown codes become TransferError)."""
    return ERRORS_BY_CODE.get(code, TransferError)(message)
