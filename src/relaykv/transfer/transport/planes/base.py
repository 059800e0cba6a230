"""Data planes: the one part that differs between transports.

The control protocol (wire/control.py), the allow-list (serving/allow_list.py), chunking,
credits, digests, timeouts and failure handling are shared by every transport
(serving/server.py, reading/client.py). A
transport only says how a chunk of pages gets from P's buffer into D's pages:

* `SenderPlane` (P side) puts the bytes of a chunk where D's `sink` says, synchronously
  (shm: into D's staging slot; tcp: into message frames) or asynchronously (nixl,
  mooncake: a one-sided WRITE into D's registered buffer, polled until done).
* `ReceiverPlane` (D side) describes where P must put bytes (`sink`), and makes a chunk's
  bytes appear in the destination pages (`land`): copy them out of a slot or frames, or
  confirm that the engine's write has landed.

Safety rules every plane follows:
* P's plane reads only the source pages the server core hands it (already validated
  against the allow-list) and never gives D a way to address P's memory.
* P's plane writes only within the memory the reader registered (once, authenticated).
* D's plane writes only the destination pages of the chunk it is landing.
* Planes never decide success: the core verifies digests over the destination pages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from relaykv.transfer.transport.layout import PageCopy


class PendingChunk(ABC):
    """A chunk the sender has started. `frames` go after the header (tcp only).

    `digests`: a staging plane hashes each page right after copying it (still in cache)
    and sets them here; otherwise (None) the server hashes the source pages itself.
    Either way a digest is of the bytes P read from the source page, before any fault
    injection flips one.
    """

    frames: Sequence[Any] = ()
    digests: list[int] | None = None

    @abstractmethod
    def poll(self) -> bool:
        """True once the bytes are where D asked; raise TransferError on failure."""

    def abort(self) -> bool:
        """Stop the chunk early if possible; True once nothing of it is still running
        (False: the server keeps polling it before the grant hold is given back)."""
        return True


class ReadyChunk(PendingChunk):
    """A chunk that was completed synchronously."""

    __slots__ = ("digests", "frames")

    def __init__(self, frames: Sequence[Any] = (), digests: list[int] | None = None) -> None:
        self.frames = frames
        self.digests = digests

    def poll(self) -> bool:
        return True


def check_rows(num_blocks: int, block_bytes: int, pages: Sequence[PageCopy]) -> None:
    """Every destination page must be a real row (not the null block) of D's buffer."""
    for page in pages:
        if not 0 < page.dst < num_blocks or page.nbytes > block_bytes:
            raise ValueError(
                f"destination block {page.dst} ({page.nbytes} B) is outside D's buffer"
            )


class SenderPlane(ABC):
    """P side of a transport (used from the server's thread only, after construction).

    A reader's destination memory comes from its registration (`register`, once per reader,
    authenticated; registrations.py), never from a Read: a Read's `sink` only selects within
    it (shm staging: which slots this transfer may use).
    """

    def register(self, registration: bytes) -> Any:
        """Parse and open a reader's destination memory; ValueError if it is unusable."""
        if registration:
            raise ValueError("this transport takes no registration")
        return None

    def destination_of(self, registered: Any) -> str:
        """A name for the registered memory (one reader per destination); "" for none."""
        return ""

    def alive(self, registered: Any) -> bool:
        """False once the registered memory's owner is known to be gone (P drops it)."""
        return True

    def unregister(self, registered: Any) -> None:  # noqa: B027 - optional hook
        """Forget a registration (unmap, drop the remote agent)."""

    def open_sink(self, registered: Any, sink: bytes) -> Any:
        """The destination of one transfer within the registration; ValueError if bad."""
        if sink:
            raise ValueError("this transport takes no per-transfer sink")
        return registered

    def check_destinations(self, sink: Any, pages: Sequence[PageCopy]) -> None:  # noqa: B027
        """Raise ValueError if a destination page lies outside what the sink offers."""

    def max_chunk_bytes(self, sink: Any, default: int) -> int:
        """The largest chunk this sink accepts (shm: the slot size)."""
        return default

    @abstractmethod
    def send_chunk(
        self,
        sink: Any,
        src: np.ndarray,
        pages: Sequence[PageCopy],
        index: int,
        transfer_id: str,
        corrupt: int | None,
    ) -> PendingChunk:
        """Start moving `pages` (chunk `index`); flip a byte of page `corrupt` if set."""

    def slot_of(self, sink: Any, index: int) -> int:
        return -1

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class ReceiverPlane(ABC):
    """D side of a transport (used from the client's IO thread only, after construction).

    `remote_writes`: True when P writes D's destination pages itself (push transports);
    then a failure D detects alone does not prove that nothing writes them any more.
    """

    remote_writes = False

    def registration(self) -> bytes:
        """This reader's destination memory, as P must open it (sent once per connection)."""
        return b""

    @abstractmethod
    def reserve(self, transfer_id: str, total_bytes: int, window: int) -> tuple[bytes, int] | None:
        """Resources for one transfer: (per-transfer sink to send P, window granted), or
        None to wait."""

    @abstractmethod
    def land(
        self,
        transfer_id: str,
        index: int,
        slot: int,
        pages: Sequence[PageCopy],
        frames: Sequence[Any],
        dst: np.ndarray,
    ) -> bool:
        """Make the chunk's bytes appear in `dst` pages; False if not there yet."""

    def progress(self) -> bool:
        """Poll the engine for completions (nixl notifications); True if anything came."""
        return False

    def wants_fast_poll(self) -> bool:
        """True while `progress` must be called often (landing depends on it)."""
        return False

    def forget(self, transfer_id: str, clean: bool) -> None:  # noqa: B027 - optional hook
        """Free the transfer's resources (slots, pending notifications). `clean` is False
        when the transfer failed: P may still be writing for it for a moment."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass
