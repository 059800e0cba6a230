"""A cluster's private runtime directory: its KV secret and its KV event sockets.

`RunDir.create()` makes `relaykv-run-XXXXXXXX` in the temp directory (`$TMPDIR`, mode 0700),
holding a lock on its `lock` file for as long as the creating process lives; `remove()`
deletes it with everything in it. `relaykv up` removes it on every exit it survives (a normal
stop, a signal, a failed start, an error). A process killed with SIGKILL cannot: its
directory, secret included, stays behind. The kernel drops the lock with the process, so a
directory whose lock can be taken is provably abandoned, and `reap_stale()` (run by every
`relaykv up` at start) removes such directories when they belong to this user. A directory
without a `lock` file (another program's, or one still being created) is never touched.

The lock is a flock(2) on the `lock` file: it is created under a temporary name, locked, and
only then renamed to `lock`, so no one can find it unlocked while its creator lives.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "relaykv-run-"
LOCK = "lock"


class RunDir:
    """One runtime directory, locked while this object holds its lock file open."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    @classmethod
    def create(cls, parent: str | None = None) -> RunDir:
        path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))  # mode 0700
        try:
            fd, pending = tempfile.mkstemp(prefix=".lock-", dir=path)  # mode 0600, close-on-exec
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.rename(pending, path / LOCK)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, fd)

    def remove(self) -> None:
        """Delete the directory and everything in it, then let go of the lock (idempotent)."""
        if self._lock_fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None


def reap_stale(parent: str | None = None) -> list[Path]:
    """Remove this user's runtime directories in `parent` (default: the temp directory) whose
    creator is gone (their lock can be taken); the directories removed."""
    root = Path(parent or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = root / name
        with contextlib.suppress(OSError):
            if _abandoned(path):
                shutil.rmtree(path)
                removed.append(path)
    return removed


def _abandoned(path: Path) -> bool:
    """`path` is a directory of this user (mode 0700, no symlink) whose `lock` file is this
    user's and can be locked now, i.e. whose creator has exited."""
    uid = os.geteuid()
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or stat.S_IMODE(info.st_mode) != 0o700:
        return False
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_uid != uid:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its creator lives
        return True  # the lock goes with this fd once the directory is gone
    finally:
        os.close(fd)
