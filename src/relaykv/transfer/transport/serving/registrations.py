"""P's record of where each reader lets it write, and its guard against replayed reads.

A reader (D) registers its destination memory once per connection (`control.Register`, an
authenticated message): its shm file or KV rows, its NIXL agent, its Mooncake buffer. P
keeps the opened registration per reader engine id and writes only within it; a Read names
the reader, never a destination of its own (docs/security.md). A registration cannot be
changed (a restarted engine has a new id), and one destination belongs to one reader.

`ReplayGuard` refuses a Read whose timestamp is outside the replay window or whose transfer
id was already seen within it, so a captured Read cannot be sent again to make P write
pages that have since been reused into D's memory.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from relaykv.transfer.transport.planes.base import SenderPlane

log = logging.getLogger(__name__)

MAX_READERS = 256
REPLAY_WINDOW_S = 60.0


@dataclass(slots=True)
class Registration:
    reader: str
    raw: bytes
    opened: Any
    destination: str


@dataclass(slots=True)
class ReaderRegistry:
    plane: SenderPlane
    _readers: OrderedDict[str, Registration] = field(default_factory=OrderedDict)
    _owners: dict[str, str] = field(default_factory=dict)  # destination -> reader

    def register(self, reader: str, raw: bytes) -> Registration:
        """Open `raw` for `reader`; ValueError if it is unusable, changes an existing
        registration, or names a destination another reader registered."""
        if not reader:
            raise ValueError("a registration needs the reader's engine id")
        known = self._readers.get(reader)
        if known is not None:
            if known.raw != raw:
                raise ValueError(f"reader {reader!r} is already registered with another memory")
            self._readers.move_to_end(reader)
            return known
        self.prune()
        opened = self.plane.register(raw)
        destination = self.plane.destination_of(opened)
        owner = self._owners.get(destination) if destination else None
        if owner is not None and owner != reader:
            self.plane.unregister(opened)
            raise ValueError(f"that destination is registered by reader {owner!r}")
        entry = Registration(reader, raw, opened, destination)
        self._readers[reader] = entry
        if destination:
            self._owners[destination] = reader
        while len(self._readers) > MAX_READERS:
            self._drop(next(iter(self._readers)))
        return entry

    def register_logged(self, reader: str, raw: bytes) -> None:
        """`register`, logging a refusal (a Register gets no answer; the reader's Reads are
        then refused as unregistered)."""
        try:
            self.register(reader, raw)
        except (ValueError, OSError, msgspec.MsgspecError) as exc:
            log.warning("kv transfer server: registration of %r refused: %s", reader, exc)

    def get(self, reader: str) -> Registration | None:
        return self._readers.get(reader)

    def prune(self) -> None:
        """Forget readers the plane knows are gone (a dead process on this host)."""
        for reader, entry in list(self._readers.items()):
            if not self.plane.alive(entry.opened):
                self._drop(reader)

    def _drop(self, reader: str) -> None:
        entry = self._readers.pop(reader)
        self._owners.pop(entry.destination, None)
        self.plane.unregister(entry.opened)

    def __len__(self) -> int:
        return len(self._readers)

    def close(self) -> None:
        for reader in list(self._readers):
            self._drop(reader)


@dataclass(slots=True)
class ReplayGuard:
    window_s: float = REPLAY_WINDOW_S
    _seen: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def check(self, transfer_id: str, issued_at: float, now: float | None = None) -> str | None:
        """None if the read is fresh (and remember it), else why it is refused."""
        now = time.time() if now is None else now
        while self._seen and next(iter(self._seen.values())) < now - self.window_s:
            self._seen.popitem(last=False)
        if abs(now - issued_at) > self.window_s:
            return (
                f"read issued {now - issued_at:+.0f}s ago is outside the {self.window_s:.0f}s "
                "replay window (clocks of P and D must agree within it)"
            )
        if transfer_id in self._seen:
            return f"transfer {transfer_id!r} was already read (replayed)"
        self._seen[transfer_id] = now
        return None
