"""`--kv-events-config JSON`: vLLM's `KVEventsConfig` keys and defaults (docs/kv-events.md).

Keys: `enable_kv_cache_events` (False), `publisher` ("null" | "zmq"; default "zmq" when events
are enabled, else "null"), `endpoint` ("tcp://*:5557"), `replay_endpoint` (None),
`buffer_steps` (10,000 batches kept for replay), `hwm` (100,000), `max_queue_size` (100,000
events waiting to be published), `topic` (""). Unknown keys and wrong types are refused,
naming the flag and the key.

Two deliberate differences: a `*` host in a tcp endpoint binds 127.0.0.1, not every interface
(docs/kv-events.md "Binding"); name an address (`tcp://0.0.0.0:5557`) to listen elsewhere.
And a tcp endpoint on any address but loopback (`off_host`) is a CURVE server whose keys
derive from the cluster secret (docs/kv-events.md "Off the host: CURVE"): both sockets then
use CURVE, and the engine refuses to start without the secret.
As in vLLM, an endpoint with `*` (host or port), `::`, `0.0.0.0`, `ipc://` or `inproc://` is
bound; any other is connected to (a subscriber that binds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FLAG = "--kv-events-config"
PUBLISHERS = ("null", "zmq")


class KVEventsConfigError(ValueError):
    """A bad `--kv-events-config`; the message names the flag and the key."""

    def __init__(self, message: str) -> None:
        super().__init__(f"argument {FLAG}: {message}")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def active(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @property
    def curve(self) -> bool:
        """Whether the stream needs CURVE: an endpoint is reachable off the host."""
        return any(off_host(e) for e in (self.endpoint, self.replay_endpoint) if e)


_INTS = ("buffer_steps", "hwm", "max_queue_size")
_STRS = ("endpoint", "topic")


def parse_kv_events_config(text: str | None) -> KVEventsConfig:
    """The config from its JSON text (None or empty: disabled)."""
    if text is None or not text.strip():
        return KVEventsConfig()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KVEventsConfigError(f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise KVEventsConfigError("must be a JSON object")
    known = set(KVEventsConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise KVEventsConfigError(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    enable = raw.get("enable_kv_cache_events", False)
    if not isinstance(enable, bool):
        raise KVEventsConfigError("enable_kv_cache_events must be true or false")
    values["enable_kv_cache_events"] = enable
    publisher = raw.get("publisher")
    if publisher is None:
        publisher = "zmq" if enable else "null"
    if publisher not in PUBLISHERS:
        raise KVEventsConfigError(f"publisher must be one of {PUBLISHERS}, got {publisher!r}")
    values["publisher"] = publisher
    for key in _INTS:
        if key in raw:
            value = raw[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise KVEventsConfigError(f"{key} must be a positive integer, got {value!r}")
            values[key] = value
    for key in _STRS:
        if key in raw:
            if not isinstance(raw[key], str):
                raise KVEventsConfigError(f"{key} must be a string")
            values[key] = raw[key]
    replay = raw.get("replay_endpoint")
    if replay is not None and not isinstance(replay, str):
        raise KVEventsConfigError("replay_endpoint must be a string or null")
    values["replay_endpoint"] = replay or None
    config = KVEventsConfig(**values)
    for key in ("endpoint", "replay_endpoint"):
        endpoint = getattr(config, key)
        if endpoint is not None and not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise KVEventsConfigError(f"{key} must start with tcp://, ipc:// or inproc://")
    return config


def binds(endpoint: str) -> bool:
    """vLLM's rule: wildcard, ipc and inproc endpoints are bound, others connected."""
    host = endpoint.removeprefix("tcp://").rpartition(":")[0]
    return (
        "*" in endpoint
        or "::" in endpoint
        or host == "0.0.0.0"
        or endpoint.startswith(("ipc://", "inproc://"))
    )


def loopback_default(endpoint: str) -> str:
    """`tcp://*:PORT` -> `tcp://127.0.0.1:PORT` (bind loopback unless told otherwise)."""
    if endpoint.startswith("tcp://*:"):
        return "tcp://127.0.0.1:" + endpoint.removeprefix("tcp://*:")
    return endpoint


_LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def off_host(endpoint: str) -> bool:
    """A tcp endpoint another host could reach (bound or connected): not loopback, and not
    `*`, which binds loopback here."""
    if not endpoint.startswith("tcp://"):
        return False  # ipc (a file in a directory the kernel guards) and inproc
    host = loopback_default(endpoint).removeprefix("tcp://").rpartition(":")[0]
    return not (host.startswith("127.") or host in _LOOPBACK_HOSTS)
