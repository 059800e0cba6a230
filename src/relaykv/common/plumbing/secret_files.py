"""Secrets read from files, never from a command line (docs/security.md).

A command line is world-readable (`/proc/PID/cmdline`); a file of mode 0600 or an
environment variable (`/proc/PID/environ` is readable by the same user only) is not. The
cluster's KV secret and the API key are read through here: `--kv-secret-file`,
`--api-key-file`, `$RELAYKV_KV_SECRET_FILE`, `$RELAYKV_API_KEY`, `$RELAYKV_API_KEY_FILE`.
On the shared floor: every layer may import it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

API_KEY_ENV = "RELAYKV_API_KEY"
API_KEY_FILE_ENV = "RELAYKV_API_KEY_FILE"


class PrivateFileError(ValueError):
    """A secret file that cannot be used (missing, readable by others, too short)."""


def read_private_file(path: str | os.PathLike[str], what: str, min_chars: int = 1) -> bytes:
    """The stripped contents of `path`; refuse a file other users could read or change."""
    target = Path(path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise PrivateFileError(f"cannot open the {what} file {target}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PrivateFileError(f"the {what} file {target} is not a regular file")
        if info.st_mode & 0o077:
            raise PrivateFileError(
                f"the {what} file {target} is readable or writable by other users "
                f"(mode {stat.S_IMODE(info.st_mode):o}); chmod 600 it"
            )
        if info.st_uid != os.geteuid():
            raise PrivateFileError(f"the {what} file {target} belongs to another user")
        data = handle.read().strip()
    if len(data) < min_chars:
        raise PrivateFileError(
            f"the {what} in {target} is too short ({len(data)} characters, need {min_chars})"
        )
    return data


def resolve_api_key(flag: str | None, file_flag: str | None) -> str | None:
    """The API key: `--api-key`, else `--api-key-file`, else `$RELAYKV_API_KEY`, else
    `$RELAYKV_API_KEY_FILE`; None when none is set (the API is open)."""
    if flag:
        return flag
    path = file_flag or os.environ.get(API_KEY_FILE_ENV)
    if not path and os.environ.get(API_KEY_ENV):
        return os.environ[API_KEY_ENV]
    if path:
        return read_private_file(path, "API key").decode()
    return None
