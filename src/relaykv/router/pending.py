"""Prefixes in flight: the prompts each engine is computing or loading now (docs/routing.md).

The index knows what an engine holds from its KV events, which arrive only as the engine
computes. A sibling that arrives while the first request of its prefix is still being
prefilled would see no hit anywhere and could land on another engine, which then computes the
prefix a second time. `InFlightPrefixes` keeps, per engine, the prompts this router has sent
there and not yet had answered; a new prompt sharing a prefix with one of them is scored as if
the engine held that prefix (kvcache's `junction_point`: the resume point the shared tokens
allow with every window kept, the prefill engines' default retention, docs/design.md §6). A
prefill engine computes the earlier request first, so by the time it admits the sibling the
blocks are there. An entry lives only until the engine answers; from then on the events tell.

A decode engine is different: its received blocks become hittable only when their transfer
has completed (docs/design.md §7); a sibling arriving during the load attaches to it and waits
for the same bytes, without a local hit. So the router holds a sibling it sends to a decode
engine that is loading the sibling's prefix until that load's request is answered (its first
streamed bytes, which D sends after the load; `awaited`, bounded by `LOAD_WAIT_S`): the prefix
then crosses the wire once and the sibling reuses it from the engine's cache, as every later
sibling does.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from relaykv.kvcache.lookup import junction_point

if TYPE_CHECKING:
    from relaykv.router.backends import Backend
    from relaykv.router.index import EngineIndex
    from relaykv.router.prompt import Prompt

LOAD_WAIT_S = 10.0  # the longest a decode sibling waits for its prefix's load to be answered


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

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._by_engine: dict[str, dict[int, tuple[Prompt, asyncio.Event, float]]] = {}
        # Per decode engine, the prompt tokens of local requests (computed there, not on a
        # prefill engine) in flight: conditional disaggregation's queue (router/policy.py).
        self._local_prefill: dict[str, int] = {}
        self._ids = itertools.count()
        self._clock = clock
        self.waits = 0  # decode sends held for a load of the same prefix (`wait_for_load`)

    def begin(self, engine: str, prompt: Prompt) -> int:
        token = next(self._ids)
        self._by_engine.setdefault(engine, {})[token] = (prompt, asyncio.Event(), self._clock())
        return token

    def end(self, engine: str, token: int) -> None:
        entry = self._by_engine.get(engine, {}).pop(token, None)
        if entry is not None:
            entry[1].set()

    def queued_prefill(self, engine: str) -> int:
        """Prompt tokens of local requests in flight on `engine` (not yet answered)."""
        return self._local_prefill.get(engine, 0)

    def add_prefill(self, engine: str, tokens: int) -> None:
        self._local_prefill[engine] = self._local_prefill.get(engine, 0) + tokens

    def count(self, engine: str) -> int:
        return len(self._by_engine.get(engine, ()))

    def hit(self, engine: str, prompt: Prompt, index: EngineIndex, cap: int) -> int:
        """The resume point `prompt` gets from prefixes in flight on `engine` (0: none)."""
        others = self._by_engine.get(engine)
        if not others:
            return 0
        best = max((shared for shared, _ in self._sharing(others, prompt, index)), default=0)
        return junction_point(index.rules, best, cap) if best else 0

    def awaited(
        self, engine: str, prompt: Prompt, index: EngineIndex, before: int | None = None
    ) -> list[asyncio.Event]:
        """The answers to wait for before sending `prompt` to decode engine `engine`: those of
        the requests in flight there that share at least one of its full blocks and (when
        `before` is given) began before entry `before`, so two siblings never wait for each
        other."""
        others = self._by_engine.get(engine)
        if not others:
            return []
        block = max(rule.block_size for rule in index.rules)
        sharing = self._sharing(others, prompt, index, before)
        return [done for shared, done in sharing if shared >= block]

    async def wait_for_load(
        self, backend: Backend, prompt: Prompt, index: EngineIndex, entry: InFlight
    ) -> None:
        """Before decode engine `backend` takes `prompt`: wait (bounded) for the loads of
        the same prefix that went there before `entry` to be answered, unless its index
        already holds as much (see the module docstring)."""
        waits = self.awaited(backend.url, prompt, index, entry.token)
        if not waits:
            return
        req = prompt.request_for(index)
        if index.usable_hit(req) >= self.hit(backend.url, prompt, index, index.resume_cap(req)):
            return
        self.waits += 1
        # The first of them to load makes the shared prefix local (no convoy behind each
        # one); the request counts on the engine meanwhile, so others spread.
        tasks = [asyncio.ensure_future(w.wait()) for w in waits]
        backend.in_flight += 1
        try:
            await asyncio.wait(tasks, timeout=LOAD_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            backend.in_flight -= 1
            for task in tasks:
                task.cancel()

    def _sharing(
        self,
        others: dict[int, tuple[Prompt, asyncio.Event, float]],
        prompt: Prompt,
        index: EngineIndex,
        before: int | None = None,
    ) -> list[tuple[int, asyncio.Event]]:
        """(tokens shared with `prompt`, answered event) per other prompt in flight. An entry
        older than `LOAD_WAIT_S` is dropped: whatever became of its request (a stream never
        read), the engine's events tell by now."""
        mine = prompt.request_for(index).hashes
        out = []
        stale = self._clock() - LOAD_WAIT_S
        for token, (other, done, started) in list(others.items()):
            if started < stale:
                del others[token]
                done.set()
            elif other is not prompt and (before is None or token < before):
                theirs = other.request_for(index).hashes
                out.append((shared_units(mine.hashes, theirs.hashes) * mine.unit, done))
        return out


class InFlight:
    """One request's entry on one engine, as a context manager: `with` ends it on exit unless
    `until_first` handed it to a stream, which ends it at the first bytes (a decode engine
    streams only once the KV is loaded). `local_prefill`: the prompt tokens a local request
    computes there, queued until then (`queued_prefill`)."""

    def __init__(
        self,
        prefixes: InFlightPrefixes,
        engine: str,
        prompt: Prompt | None,
        local_prefill: int = 0,
    ) -> None:
        self.engine = engine
        self.token = prefixes.begin(engine, prompt) if prompt is not None else None
        self._prefixes = prefixes
        self._handed_off = False
        self._local_prefill = local_prefill
        if local_prefill:
            prefixes.add_prefill(engine, local_prefill)

    def done(self) -> None:
        if self.token is not None:
            self._prefixes.end(self.engine, self.token)
        if self._local_prefill:
            self._prefixes.add_prefill(self.engine, -self._local_prefill)
            self._local_prefill = 0

    def __enter__(self) -> InFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._handed_off:
            self.done()

    def until_first(self, chunks: AsyncIterable[Any]) -> AsyncIterator[Any]:
        """`chunks`, ending this entry at the first one (handed off now, not when the
        stream starts: leaving `with` must not end it)."""
        self._handed_off = True
        relay = self._ends_at_first(chunks)
        # Dropped unread (the client left before the first byte), it ends the entry when
        # collected: its local prefill must not stay queued on the engine.
        weakref.finalize(relay, self.done)
        return relay

    async def _ends_at_first(self, chunks: AsyncIterable[Any]) -> AsyncIterator[Any]:
        try:
            async for chunk in chunks:
                self.done()
                yield chunk
        finally:
            self.done()
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
