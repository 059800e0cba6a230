"""Prefixes being computed now: the prompts in flight on each prefill engine (docs/routing.md).

The index knows what an engine holds from its KV events, which arrive only as the engine
computes. A sibling that arrives while the first request of its prefix is still being
prefilled would see no hit anywhere and could land on another engine, which then computes the
prefix a second time. `InFlightPrefixes` keeps, per engine, the prompts this router has sent
there and not yet had answered; a new prompt sharing a prefix with one of them is scored as if
the engine held that prefix (kvcache's `junction_point`: the resume point the shared tokens
allow with every window kept, the prefill engines' default retention, docs/design.md §6). The
engine computes the earlier request first, so by the time it admits the sibling the blocks
are there. An entry lives only until the engine answers; from then on the events tell.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from relaykv.kvcache.lookup import junction_point

if TYPE_CHECKING:
    from relaykv.router.index import EngineIndex
    from relaykv.router.routing import Prompt


def shared_units(a: list[bytes], b: list[bytes]) -> int:
    """Leading unit hashes two chains share (chained: equal at k means equal below k)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # invariant: a[:lo] == b[:lo]; the answer is in [lo, hi]
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class InFlightPrefixes:
    """Per engine URL, the prompts this router has in flight there (see module docstring)."""

    def __init__(self) -> None:
        self._by_engine: dict[str, dict[int, Prompt]] = {}
        self._ids = itertools.count()

    def begin(self, engine: str, prompt: Prompt) -> int:
        token = next(self._ids)
        self._by_engine.setdefault(engine, {})[token] = prompt
        return token

    def end(self, engine: str, token: int) -> None:
        self._by_engine.get(engine, {}).pop(token, None)

    def count(self, engine: str) -> int:
        return len(self._by_engine.get(engine, ()))

    def hit(self, engine: str, prompt: Prompt, index: EngineIndex, cap: int) -> int:
        """The resume point `prompt` gets from prefixes in flight on `engine` (0: none)."""
        others = self._by_engine.get(engine)
        if not others:
            return 0
        mine = prompt.request_for(index).hashes
        best = 0
        for other in others.values():
            if other is prompt:
                continue
            theirs = other.request_for(index).hashes
            shared = shared_units(mine.hashes, theirs.hashes) * mine.unit
            if shared > best:
                best = shared
        return junction_point(index.rules, best, cap) if best else 0
