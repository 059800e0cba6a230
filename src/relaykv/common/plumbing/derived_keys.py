"""Keys derived from the cluster secret (docs/security.md, "The cluster secret").

One secret per cluster (a 0600 file, `$RELAYKV_KV_SECRET_FILE` or `--kv-secret-file`); every
key a member needs is derived from it with HMAC-SHA256 under a label, so no second secret
has to be distributed: the transfer plane's message and grant keys
(`relaykv.transfer.transport.wire.auth`) and the KV event stream's CURVE key pairs (below).

**KV events off the host** (docs/kv-events.md, "Off the host: CURVE"). The publisher is a
CURVE server with the key pair derived under `kv-events/publisher`; the subscriber a CURVE
client with the pair derived under `kv-events/subscriber`, which also knows the publisher's
public key. CURVE encrypts and authenticates the stream, and a ZAP handler on the publisher
(`ClusterOnlyZap`) accepts only the subscriber's public key: a peer without the secret fails
the handshake and receives nothing, on the PUB and on the replay socket alike.
On the shared floor: every layer may import it.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from relaykv.common.plumbing.secret_files import read_private_file

KV_SECRET_ENV = "RELAYKV_KV_SECRET_FILE"
MIN_SECRET_CHARS = 32
ZAP_DOMAIN = b"relaykv-kv-events"


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A 32-byte key for `purpose`, derived from the cluster secret."""
    return hmac.new(secret, b"relaykv/kv-secret/" + purpose.encode(), hashlib.sha256).digest()


def read_cluster_secret(path: str) -> bytes:
    """The cluster secret from its file (refused: readable by others, too short)."""
    return read_private_file(path, "KV secret", MIN_SECRET_CHARS)


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """Z85-encoded CURVE key pairs of the KV event publisher and its subscribers."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> CurveKeys:
        import zmq
        from zmq.utils import z85

        server = z85.encode(derive_key(secret, "kv-events/publisher"))
        client = z85.encode(derive_key(secret, "kv-events/subscriber"))
        return cls(zmq.curve_public(server), server, zmq.curve_public(client), client)

    def serve(self, sock: Any) -> None:
        """Make `sock` (before bind) a CURVE server that only the ZAP handler admits to."""
        sock.curve_secretkey = self.server_secret
        sock.curve_publickey = self.server_public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN

    def connect_as_client(self, sock: Any) -> None:
        """Make `sock` (before connect) the cluster's CURVE client."""
        sock.curve_secretkey = self.client_secret
        sock.curve_publickey = self.client_public
        sock.curve_serverkey = self.server_public


class ClusterOnlyZap:
    """A ZAP handler (pyzmq's authenticator thread) on `context`: a CURVE client is admitted
    only with the cluster's subscriber key; every other mechanism and key is refused."""

    def __init__(self, context: Any, keys: CurveKeys) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self._allowed = keys.client_public
        self.refused = 0
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN.decode(), self)

    def callback(self, domain: str, key: bytes) -> bool:
        ok = hmac.compare_digest(key, self._allowed)
        if not ok:
            self.refused += 1
        return ok

    def stop(self) -> None:
        self._auth.stop()
