"""Object names and value tags of a shared KV store (docs/tier.md "Mooncake Store",
docs/security.md "The KV store").

Every object is one block of one group. Its name is an HMAC under a key derived from the
cluster secret over a namespace (the served model and the KV layout: engines of another
model never share a block) and the block's key (chained over the tokens and the cache salt,
so tenants with different salts never share one). Who lacks the secret can neither name
the object of a prompt (no "was this prompt served?" probe) nor aim a write at one.

A value is the block's bytes followed by a 32-byte HMAC-SHA256 tag under a second derived
key, over the object's name and the bytes: a load accepts only bytes a member of the
cluster stored under that very name (a forged or moved value fails the load, which the
engine then computes). Values are authenticated, not encrypted (docs/security.md).

Each engine also keeps one *marker* in its own segment (`marker`, named after the segment:
see `mooncake.py`), a one-byte object no engine reads.
"""

from __future__ import annotations

import hashlib
import hmac

from relaykv.common.plumbing.derived_keys import derive_key

TAG_BYTES = 32
NAME_PREFIX = "relaykv/"
MARKER_PREFIX = NAME_PREFIX + "segment/"  # never a block's name (those are 48 hex digits)


class StoreKeys:
    """Names and tags of one engine's objects."""

    __slots__ = ("_names", "_namespace", "_tags")

    def __init__(self, secret: bytes, namespace: str) -> None:
        self._names = derive_key(secret, "kv-store/names")
        self._tags = derive_key(secret, "kv-store/tags")
        self._namespace = hashlib.sha256(namespace.encode()).digest()

    def name(self, group: int, key: bytes) -> str:
        """The store's name of `group`'s block keyed `key`."""
        mac = hmac.new(self._names, self._namespace, hashlib.sha256)
        mac.update(group.to_bytes(4, "little"))
        mac.update(key)
        return NAME_PREFIX + mac.hexdigest()[:48]

    def marker(self, segment: str) -> str:
        """The name of the marker the engine lending `segment` keeps in it."""
        mac = hmac.new(self._names, b"segment-marker|" + segment.encode(), hashlib.sha256)
        return MARKER_PREFIX + mac.hexdigest()[:48]

    def tag(self, name: str, data: memoryview | bytes) -> bytes:
        """The tag a value stored under `name` with these bytes carries."""
        mac = hmac.new(self._tags, name.encode(), hashlib.sha256)
        mac.update(data)
        return mac.digest()

    def verify(self, name: str, data: memoryview | bytes, tag: memoryview | bytes) -> bool:
        return hmac.compare_digest(self.tag(name, data), bytes(tag))
