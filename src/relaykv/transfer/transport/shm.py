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
base.py). The name P opens is checked against a strict pattern so a reader cannot point
P at another file.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from relaykv.transfer.transport.base import KVTransport, TransportOptions
from relaykv.transfer.transport.errors import TransferError
from relaykv.transfer.transport.integrity import page_digest
from relaykv.transfer.transport.layout import PageCopy, PageLayout
from relaykv.transfer.transport.planes import PendingChunk, ReadyChunk, ReceiverPlane, SenderPlane

SHM_DIR = "/dev/shm"
NAME_PATTERN = re.compile(r"relaykv-[0-9a-f]{32}")
QUARANTINE_S = 2.0  # a failed transfer's slots rest this long before reuse
MAX_MAPPINGS = 32


class ShmSink(msgspec.Struct, frozen=True):
    """Staging: `slots` of `slot_bytes` in file `name`. Direct: the file is D's KV buffer,
    rows of `slot_bytes` (= block_bytes) indexed by destination block; `slots` is empty."""

    name: str
    slot_bytes: int
    slots: list[int]
    direct: bool = False


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class SharedFile:
    """A fresh shared-memory file (mode 0600), unlinked when this object goes away."""

    def __init__(self, nbytes: int) -> None:
        self.name = f"relaykv-{uuid.uuid4().hex}"
        path = os.path.join(SHM_DIR, self.name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self._map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, _unlink, path)
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)

    def close(self) -> None:
        self._finalizer()


_SHARED_BUFFERS: weakref.WeakValueDictionary[int, SharedKVBuffer] = weakref.WeakValueDictionary()


class SharedKVBuffer:
    """A KV buffer `[num_blocks, block_bytes]` in shared memory, for shm direct mode.

    The engine allocates its KV buffer with this (and gives `array`, or
    `torch.from_numpy(array)`, to the model layer) so that P can write received pages
    straight into it. Keep this object alive as long as the buffer is used.
    """

    def __init__(self, layout: PageLayout) -> None:
        self.layout = layout
        self._file = SharedFile(layout.total_bytes)
        self.name = self._file.name
        self.array = self._file.bytes.reshape(layout.num_blocks, layout.block_bytes)
        _SHARED_BUFFERS[self.array.ctypes.data] = self

    @classmethod
    def owning(cls, array: np.ndarray) -> SharedKVBuffer | None:
        """The shared buffer `array` is exactly, if any."""
        found = _SHARED_BUFFERS.get(array.ctypes.data)
        if found is not None and found.array.shape == array.shape:
            return found
        return None

    def close(self) -> None:
        self._file.close()


class ShmReceiver(ReceiverPlane):
    def __init__(self, buffer: np.ndarray, layout: PageLayout, options: TransportOptions) -> None:
        shared = SharedKVBuffer.owning(buffer)
        self.direct = shared is not None
        self.remote_writes = self.direct
        self._direct_sink = b""
        if shared is not None:
            self._direct_sink = msgspec.msgpack.encode(
                ShmSink(shared.name, layout.block_bytes, [], direct=True)
            )
        self.slot_bytes = max(options.chunk_bytes, layout.block_bytes)
        num_slots = 0 if self.direct else max(2, options.staging_bytes // self.slot_bytes)
        self._area: SharedFile | None = None
        self._num_slots = num_slots
        self._free: list[int] = list(range(num_slots))
        self._owned: dict[str, list[int]] = {}
        self._resting: list[tuple[float, list[int]]] = []

    def reserve(self, transfer_id: str, total_bytes: int, window: int) -> tuple[bytes, int] | None:
        if self.direct:
            return self._direct_sink, window
        if self._area is None:  # created on first use, in the IO thread
            self._area = SharedFile(self._num_slots * self.slot_bytes)
        now = time.monotonic()
        while self._resting and self._resting[0][0] <= now:
            self._free.extend(self._resting.pop(0)[1])
        want = min(window, max(1, math.ceil(total_bytes / self.slot_bytes)), len(self._free))
        if want == 0:
            return None
        slots = [self._free.pop() for _ in range(want)]
        self._owned[transfer_id] = slots
        sink = ShmSink(self._area.name, self.slot_bytes, slots)
        return msgspec.msgpack.encode(sink), want

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
    def __init__(self) -> None:
        self._maps: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    def open_sink(self, sink: bytes) -> tuple[np.ndarray, ShmSink]:
        spec = msgspec.msgpack.decode(sink, type=ShmSink)
        if not NAME_PATTERN.fullmatch(spec.name):
            raise ValueError(f"staging name {spec.name!r} is not a relaykv staging area")
        if spec.slot_bytes < 1 or bool(spec.slots) == spec.direct:
            raise ValueError("a sink needs slot_bytes >= 1 and slots unless it is direct")
        key = (spec.name, spec.slot_bytes)
        slots = self._maps.get(key)
        if slots is None:
            fd = os.open(os.path.join(SHM_DIR, spec.name), os.O_RDWR | os.O_NOFOLLOW)
            try:
                size = os.fstat(fd).st_size
                if size == 0 or size % spec.slot_bytes:
                    raise ValueError(f"staging size {size} is not a multiple of {spec.slot_bytes}")
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            slots = np.frombuffer(mapping, dtype=np.uint8).reshape(-1, spec.slot_bytes)
            self._maps[key] = slots
            while len(self._maps) > MAX_MAPPINGS:
                self._maps.popitem(last=False)  # unmapped once no view refers to it
        self._maps.move_to_end(key)
        bad = [s for s in spec.slots if not 0 <= s < slots.shape[0]]
        if bad:
            raise ValueError(f"staging slots {bad} out of range 0..{slots.shape[0] - 1}")
        return slots, spec

    def check_destinations(self, sink: Any, pages: Sequence[PageCopy]) -> None:
        rows, spec = sink
        for page in pages:
            if spec.direct and not 0 < page.dst < rows.shape[0]:
                raise ValueError(f"destination block {page.dst} is outside D's buffer")
            if page.nbytes > spec.slot_bytes:
                raise ValueError(f"a {page.nbytes}-byte page does not fit {spec.slot_bytes} bytes")

    def max_chunk_bytes(self, sink: Any, default: int) -> int:
        return default if sink[1].direct else min(default, sink[1].slot_bytes)

    def slot_of(self, sink: Any, index: int) -> int:
        slots = sink[1].slots
        return slots[index % len(slots)] if slots else -1

    def send_chunk(
        self,
        sink: Any,
        src: np.ndarray,
        pages: Sequence[PageCopy],
        index: int,
        transfer_id: str,
        corrupt: int | None,
    ) -> PendingChunk:
        rows, spec = sink
        digests = []
        if spec.direct:  # straight into D's destination rows
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

    def close(self) -> None:
        self._maps.clear()


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
