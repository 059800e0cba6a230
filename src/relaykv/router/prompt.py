"""A request's prompt as the router scores it (docs/routing.md).

The tokens are hashed once per engine geometry, on first use, and the result is shared by
every engine of that geometry and by both of the request's decisions (prefill, then decode);
`chains`, the router's memo of recently hashed prefixes, makes a prompt that shares a system
prompt with recent ones hash only the rest (`kvcache.hashing.PrefixChains`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relaykv.kvcache import CacheRequest
from relaykv.kvcache.hashing import PrefixChains
from relaykv.router.holders import KeyHolders, PromptCounts
from relaykv.router.index import EngineIndex


@dataclass(slots=True)
class Prompt:
    """A request's prompt tokens, hashed once per geometry and shared by its prefill and
    decode decisions; `chains` is the router's memo of recently hashed prefixes."""

    tokens: list[int]
    salt: str | None = None
    chains: PrefixChains | None = None
    _requests: dict[Any, CacheRequest] = field(default_factory=dict)
    _counts: dict[Any, PromptCounts] = field(default_factory=dict)

    def counts(self, holders: KeyHolders, index: EngineIndex, group: int) -> PromptCounts:
        """Per engine slot, the prompt's keys held in `group` (one pass for all engines)."""
        key = (index.geometry, group)
        found = self._counts.get(key)
        if found is None:
            keys = self.request_for(index).keys(group)
            found = self._counts[key] = PromptCounts(holders, group, keys)
        return found

    def recount(self) -> None:
        """Forget the counts: the holders map changed (a new decision begins)."""
        self._counts.clear()

    def request_for(self, index: EngineIndex) -> CacheRequest:
        """One hashed request per geometry, shared by every engine that has it."""
        key = index.geometry
        req = self._requests.get(key)
        if req is None:
            req = self._requests[key] = index.request(
                self.tokens, self.salt, chains=self.chains
            )
        return req
