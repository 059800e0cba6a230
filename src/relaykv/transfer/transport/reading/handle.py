"""What `TransferClient.start_read` returns: a handle the engine polls, and its result."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

from relaykv.transfer.transport.descriptor import KVSourceDescriptor


@dataclass(frozen=True, slots=True)
class TransferResult:
    transfer_id: str
    request_id: str
    num_pages: int
    nbytes: int
    seconds: float


class TransferHandle:
    """One read in flight. `done()` never blocks; `result()` raises the TransferError."""

    def __init__(
        self,
        transfer_id: str,
        request_id: str,
        source: KVSourceDescriptor,
        num_pages: int,
        nbytes: int,
    ) -> None:
        self.transfer_id = transfer_id
        self.request_id = request_id
        self.source = source
        self.num_pages = num_pages
        self.nbytes = nbytes
        self.started = time.monotonic()
        self._future: Future[TransferResult] = Future()

    def done(self) -> bool:
        return self._future.done()

    @property
    def status(self) -> str:
        """`pending`, `done` or `failed`."""
        if not self._future.done():
            return "pending"
        return "failed" if self._future.exception() is not None else "done"

    def result(self, timeout: float | None = None) -> TransferResult:
        """Wait (at most `timeout` s, None: until the transfer's own deadline) and return
        the result; raises the transfer's TransferError."""
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def __repr__(self) -> str:
        return f"TransferHandle({self.transfer_id[:8]}, {self.request_id!r}, {self.status})"
