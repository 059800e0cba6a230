"""`--kv-transport shm` (default on one host): pages through shared memory, control over
ZeroMQ.

D owns a staging area in `/dev/shm` (mode 0600, split into slots of `slot_bytes`) and
lends a few slots to each transfer. P validates the read, copies the chunk's pages into
D's slot (push), and announces it; D copies the slot into its destination pages,
verifies them, and gives the slot back as a credit. P and D work on different slots at
the same time, so the copy in and the copy out overlap.

Direct mode: if D's KV buffer itself lives in shared memory (allocated with
`SharedKVBuffer`), P copies each page straight into D's destination row instead of a
slot, saving D's copy (the same push model as nixl/mooncake; D then only verifies).

Why never mapping P's KV buffer: a reader that could map P's buffer could read any page
of any request; here only pages P validated ever leave P's memory (safety rule 1,
base.py). Where P writes comes only from D's registration (once per connection, over the
authenticated plane; registrations.py): a file whose name matches a strict pattern, owned by
this user with mode 0600, registered by no other reader; a Read only picks slots or rows
inside it (docs/security.md). P unmaps it once D's process is gone.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from relaykv.transfer.transport.base import KVTransport, TransportOptions
from relaykv.transfer.transport.errors import TransferError
from relaykv.transfer.transport.layout import PageCopy, PageLayout
from relaykv.transfer.transport.planes.base import (
    PendingChunk,
    ReadyChunk,
    ReceiverPlane,
    SenderPlane,
)
from relaykv.transfer.transport.planes.shm_files import (
    NAME_PATTERN,
    SHM_DIR,
    SharedFile,
    SharedKVBuffer,
    owner_alive,
)
from relaykv.transfer.transport.wire.integrity import page_digest

__all__ = ["SharedKVBuffer", "ShmRegistration", "ShmSlots", "ShmTransport"]

QUARANTINE_S = 2.0  # a failed transfer's slots rest this long before reuse


class ShmRegistration(msgspec.Struct, frozen=True):
    """D's file, registered once: a staging area of slots of `slot_bytes`, or (direct) D's
    KV buffer itself, rows of `slot_bytes` (= block_bytes) indexed by destination block."""

    name: str
    slot_bytes: int
    direct: bool = False


class ShmSlots(msgspec.Struct, frozen=True):
    """Per transfer (staging only): the slots D lent it."""

    slots: list[int]


@dataclass(slots=True)
class _Mapped:
    spec: ShmRegistration
    rows: np.ndarray  # [n, slot_bytes] view of the mapping


@dataclass(slots=True)
class _Sink:
    rows: np.ndarray
    spec: ShmRegistration
    slots: list[int]


class ShmReceiver(ReceiverPlane):
    def __init__(self, buffer: np.ndarray, layout: PageLayout, options: TransportOptions) -> None:
        shared = SharedKVBuffer.owning(buffer)
        self.direct = shared is not None
        self.remote_writes = self.direct
        self.slot_bytes = max(options.chunk_bytes, layout.block_bytes)
        self._registration = b""
        if shared is not None:
            self._registration = msgspec.msgpack.encode(
                ShmRegistration(shared.name, layout.block_bytes, direct=True)
            )
        num_slots = 0 if self.direct else max(2, options.staging_bytes // self.slot_bytes)
        self._area: SharedFile | None = None
        self._num_slots = num_slots
        self._free: list[int] = list(range(num_slots))
        self._owned: dict[str, list[int]] = {}
        self._resting: list[tuple[float, list[int]]] = []

    def registration(self) -> bytes:
        if not self._registration:  # the staging area, created on first use (IO thread)
            self._area = SharedFile(self._num_slots * self.slot_bytes)
            self._registration = msgspec.msgpack.encode(
                ShmRegistration(self._area.name, self.slot_bytes)
            )
        return self._registration

    def reserve(self, transfer_id: str, total_bytes: int, window: int) -> tuple[bytes, int] | None:
        if self.direct:
            return b"", window
        self.registration()
        now = time.monotonic()
        while self._resting and self._resting[0][0] <= now:
            self._free.extend(self._resting.pop(0)[1])
        want = min(window, max(1, math.ceil(total_bytes / self.slot_bytes)), len(self._free))
        if want == 0:
            return None
        slots = [self._free.pop() for _ in range(want)]
        self._owned[transfer_id] = slots
        return msgspec.msgpack.encode(ShmSlots(slots)), want

    def land(
        self,
        transfer_id: str,
        index: int,
        slot: int,
        pages: Sequence[PageCopy],
        frames: Sequence[Any],
        dst: np.ndarray,
    ) -> bool:
        if self.direct:
            return True  # P wrote the destination rows; the client verifies them
        if self._area is None or slot not in self._owned.get(transfer_id, ()):
            raise TransferError(f"chunk announced in slot {slot}, not one lent to this transfer")
        staged = self._area.bytes[slot * self.slot_bytes : (slot + 1) * self.slot_bytes]
        offset = 0
        for page in pages:
            np.copyto(dst[page.dst, : page.nbytes], staged[offset : offset + page.nbytes])
            offset += page.nbytes
        return True

    def forget(self, transfer_id: str, clean: bool) -> None:
        slots = self._owned.pop(transfer_id, None)
        if not slots:
            return
        if clean:
            self._free.extend(slots)
        else:  # P may still be writing a chunk it had started
            self._resting.append((time.monotonic() + QUARANTINE_S, slots))

    def check_invariants(self) -> None:
        owned = [s for slots in self._owned.values() for s in slots]
        resting = [s for _, slots in self._resting for s in slots]
        every = sorted(self._free + owned + resting)
        assert every == list(range(self._num_slots)), "staging slots lost or duplicated"

    def close(self) -> None:
        if self._area is not None:
            self._area.close()


class ShmSender(SenderPlane):
    def register(self, registration: bytes) -> _Mapped:
        spec = msgspec.msgpack.decode(registration, type=ShmRegistration)
        if not NAME_PATTERN.fullmatch(spec.name):
            raise ValueError(f"{spec.name!r} is not a relaykv shared-memory file")
        if spec.slot_bytes < 1:
            raise ValueError("a registration needs slot_bytes >= 1")
        fd = os.open(os.path.join(SHM_DIR, spec.name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o077 or not stat.S_ISREG(
                info.st_mode
            ):
                raise ValueError(f"{spec.name} is not a private file of this user")
            size = info.st_size
            if size == 0 or size % spec.slot_bytes:
                raise ValueError(f"file size {size} is not a multiple of {spec.slot_bytes}")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return _Mapped(spec, np.frombuffer(mapping, dtype=np.uint8).reshape(-1, spec.slot_bytes))

    def destination_of(self, registered: _Mapped) -> str:
        return registered.spec.name

    def alive(self, registered: _Mapped) -> bool:
        return owner_alive(registered.spec.name)

    def open_sink(self, registered: _Mapped, sink: bytes) -> _Sink:
        if registered.spec.direct:
            if sink:
                raise ValueError("a direct registration takes no slots")
            return _Sink(registered.rows, registered.spec, [])
        slots = msgspec.msgpack.decode(sink, type=ShmSlots).slots
        bad = [s for s in slots if not 0 <= s < registered.rows.shape[0]]
        if not slots or bad:
            raise ValueError(f"staging slots {bad or slots} out of range")
        return _Sink(registered.rows, registered.spec, slots)

    def check_destinations(self, sink: _Sink, pages: Sequence[PageCopy]) -> None:
        for page in pages:
            if sink.spec.direct and not 0 < page.dst < sink.rows.shape[0]:
                raise ValueError(f"destination block {page.dst} is outside D's buffer")
            if page.nbytes > sink.spec.slot_bytes:
                raise ValueError(
                    f"a {page.nbytes}-byte page does not fit {sink.spec.slot_bytes} bytes"
                )

    def max_chunk_bytes(self, sink: Any, default: int) -> int:
        return default if sink.spec.direct else min(default, sink.spec.slot_bytes)

    def slot_of(self, sink: _Sink, index: int) -> int:
        return sink.slots[index % len(sink.slots)] if sink.slots else -1

    def send_chunk(
        self,
        sink: Any,
        src: np.ndarray,
        pages: Sequence[PageCopy],
        index: int,
        transfer_id: str,
        corrupt: int | None,
    ) -> PendingChunk:
        rows = sink.rows
        digests = []
        if sink.spec.direct:  # straight into D's destination rows
            for i, page in enumerate(pages):
                target = rows[page.dst, : page.nbytes]
                np.copyto(target, src[page.src, : page.nbytes])
                digests.append(page_digest(target))
                if i == corrupt:
                    target[page.nbytes // 2] ^= 0xFF
            return ReadyChunk(digests=digests)
        staged = rows[self.slot_of(sink, index)]
        if sum(p.nbytes for p in pages) > staged.size:
            raise TransferError(
                f"chunk of {len(pages)} pages does not fit a {staged.size}-byte slot"
            )
        offset = 0
        for i, page in enumerate(pages):
            target = staged[offset : offset + page.nbytes]
            np.copyto(target, src[page.src, : page.nbytes])
            digests.append(page_digest(target))  # hashed while the page is in cache
            if i == corrupt:
                target[page.nbytes // 2] ^= 0xFF
            offset += page.nbytes
        return ReadyChunk(digests=digests)


class ShmTransport(KVTransport):
    name = "shm"
    summary = "same host: pages through a shared-memory staging area, control over ZeroMQ"

    @classmethod
    def availability(cls) -> str | None:
        if not os.path.isdir(SHM_DIR):
            return f"{SHM_DIR} does not exist (Linux shared memory is required)"
        return None

    def sender_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> SenderPlane:
        return ShmSender()

    def receiver_plane(
        self, buffer: Any, layout: PageLayout, options: TransportOptions
    ) -> ReceiverPlane:
        return ShmReceiver(buffer, layout, options)
