"""KV events of one engine's cache, as consumers expect them (docs/kv-events.md).

The pool reports what it can serve (`stored`, `removed`, `cleared`) with keys and block ids
only. While the cache manager keys a request's blocks it names that request
(`publishing(req, lowest_index)`), and `stored` events of those blocks gain the key of the
block before the first one (`parent`) and the tokens they cover (`token_ids`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType

from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.pool import BlockPool, EventSink, KVEvent
from relaykv.kvcache.request import CacheRequest


class KVEventSource:
    """Forwards one pool's events to a sink, adding parent keys and token ids."""

    __slots__ = ("_current", "_sink", "pool", "rules")

    def __init__(self, pool: BlockPool, rules: tuple[GroupRules, ...]) -> None:
        self.pool = pool
        self.rules = rules
        self._sink: EventSink | None = None
        self._current: tuple[CacheRequest, int] | None = None  # (request, lowest index)

    def set_sink(self, sink: EventSink | None) -> None:
        """Send the pool's events to `sink` (None: no events, no cost)."""
        self._sink = sink
        self.pool.on_event = None if sink is None else self._emit

    def publishing(self, req: CacheRequest, lowest_index: int) -> AbstractContextManager[None]:
        """Name the request whose blocks (from `lowest_index` on) the pool is about to key."""
        return _Publishing(self, req, lowest_index)

    def emit(self, event: KVEvent) -> None:
        """Send an event that is not the pool's (the KV tier's) to the sink, if any."""
        if self._sink is not None:
            self._sink(event)

    def _emit(self, event: KVEvent) -> None:
        current = self._current
        if event.kind == "stored" and current is not None:
            req, lo = current
            table = req.tables[event.group]
            wanted = set(event.block_ids)
            where = {b: k for k, b in enumerate(table[lo:], lo) if b in wanted}
            ks = [where[b] for b in event.block_ids if b in where]
            if len(ks) == len(event.block_ids):
                size = self.rules[event.group].block_size
                tokens = req.tokens
                token_ids = tuple(t for k in ks for t in tokens[k * size : (k + 1) * size])
                keys = req.keys(event.group)
                parent = keys[ks[0] - 1] if ks[0] > 0 else None
                event = KVEvent(
                    "stored", event.group, event.keys, event.block_ids, parent, token_ids
                )
        assert self._sink is not None
        self._sink(event)


class _Publishing(AbstractContextManager[None]):
    __slots__ = ("lowest", "req", "source")

    def __init__(self, source: KVEventSource, req: CacheRequest, lowest: int) -> None:
        self.source, self.req, self.lowest = source, req, lowest

    def __enter__(self) -> None:
        self.source._current = (self.req, self.lowest)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.source._current = None
