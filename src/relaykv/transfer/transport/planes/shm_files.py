"""Shared-memory files of the shm transport: creation, naming, and cleanup of dead owners.

Every file is `/dev/shm/relaykv-<creator pid>-<32 hex>`, mode 0600. A file outlives a process
killed with SIGKILL (nothing runs to unlink it), and a decode engine's KV pool file is large
(its whole pool), so:

* `clean_stale_files()` removes this user's relaykv files whose creator is dead; every
  engine that creates a shared file runs it first, and `relaykv up` runs it after a member
  dies (docs/security.md, "Shared memory");
* P drops its mapping of a reader's file once the reader's process is gone (`owner_alive`),
  so the memory is really returned.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import uuid
import weakref

import numpy as np

from relaykv.transfer.transport.layout import PageLayout

SHM_DIR = "/dev/shm"
NAME_PATTERN = re.compile(r"relaykv-([0-9]{1,10})-[0-9a-f]{32}")


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def owner_pid(name: str) -> int | None:
    """The pid that created the relaykv shm file `name`, or None if it is not one."""
    found = NAME_PATTERN.fullmatch(name)
    return int(found.group(1)) if found else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def owner_alive(name: str) -> bool:
    pid = owner_pid(name)
    return pid is not None and pid_alive(pid)


def clean_stale_files(directory: str = SHM_DIR) -> list[str]:
    """Unlink this user's relaykv shm files whose creating process is gone; their names."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    uid = os.geteuid()
    for name in names:
        pid = owner_pid(name)
        if pid is None or pid_alive(pid):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == uid:
                os.unlink(path)
                removed.append(name)
    return removed


class SharedFile:
    """A fresh shared-memory file (mode 0600), unlinked when this object goes away."""

    def __init__(self, nbytes: int) -> None:
        clean_stale_files()
        self.name = f"relaykv-{os.getpid()}-{uuid.uuid4().hex}"
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
