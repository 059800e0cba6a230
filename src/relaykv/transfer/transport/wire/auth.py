"""The cluster secret: it authenticates every transfer-plane message and signs grants.

Threat model and what is protected: docs/security.md. In short, every engine of a cluster
shares one secret (`relaykv up` generates it in a 0600 file; two hosts copy that file, or
give `--kv-secret-file`); it never appears on a command line. From it two keys are derived
(`relaykv.common.plumbing.derived_keys`, which also derives the KV event stream's CURVE keys):

* the message key: an HMAC-SHA256 over every ZeroMQ control message in both directions (a
  process without the secret, e.g. another local user, cannot make P read, write or
  release anything, nor feed D a chunk header);
* the grant key: P signs the transfer parameters it returns (request, block ids, the exact
  block hashes of the prompt it computed, its endpoint, an expiry), and D refuses
  parameters whose signature or hashes do not match (`relaykv.transfer.grant`).

A process that gets no secret (library use, in-process tests) uses the one named by
`$RELAYKV_KV_SECRET_FILE`, else a random secret of its own: both ends in one process agree,
nothing outside it can talk to them.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from relaykv.common.plumbing.derived_keys import KV_SECRET_ENV as SECRET_ENV
from relaykv.common.plumbing.derived_keys import derive_key, read_cluster_secret
from relaykv.common.plumbing.secret_files import PrivateFileError

MAC_BYTES = 32
TO_SERVER = b"relaykv/kv/to-server\x00"
TO_CLIENT = b"relaykv/kv/to-client\x00"


class SecretError(PrivateFileError):
    """A secret file that cannot be used (missing, readable by others, too short)."""


def write_secret_file(path: str | os.PathLike[str]) -> Path:
    """Create a fresh secret in `path` (mode 0600; fails if the file exists)."""
    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32) + "\n")
    return target


def load_secret_file(path: str | os.PathLike[str]) -> bytes:
    """Read a secret file; refuse one that other users could read or change."""
    try:
        return read_cluster_secret(str(path))
    except PrivateFileError as exc:
        raise SecretError(f"{exc} (`relaykv up` writes one)") from None


@functools.cache
def default_secret() -> bytes:
    """`$RELAYKV_KV_SECRET_FILE`'s secret, else a random one private to this process."""
    path = os.environ.get(SECRET_ENV)
    if path:
        return load_secret_file(path)
    return secrets.token_bytes(32)


class MessageAuth:
    """HMAC-SHA256 tags for control messages; the direction is part of what is signed, so
    a message cannot be reflected back to its sender."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        self._key = derive_key(secret, "messages")

    def tag(self, direction: bytes, payload: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, direction, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def check(self, direction: bytes, payload: bytes | memoryview, tag: bytes | memoryview) -> bool:
        return hmac.compare_digest(self.tag(direction, payload), bytes(tag))
