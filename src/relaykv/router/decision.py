"""The routing decision passed down the request path (docs/routing.md).

`Routing.pick` returns a `Choice`: the engine chosen for one request, with its `Decision`
record (kept in `Routing.recent`, shown by `GET /routing?recent=1`). The request path
(router/relay.py) carries the choice down and never hands it back: `with choice:` puts the
prompt among the prefixes in flight on that engine until the engine answers (router/pending.py),
`prefix_loaded` waits for a load of the same prefix on a decode engine, `note_answer` records a
prefill engine's own `cached_tokens`, `until_first` hands the entry to a decode stream. On a
decode engine's choice, `Routing.decide_path` sets `path` (conditional disaggregation,
router/policy.py `ConditionalRule`): a local request's suffix counts as queued prefill there
while it is in flight.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

from relaykv.router.backends import Backend
from relaykv.router.index import EngineIndex
from relaykv.router.pending import InFlight, InFlightPrefixes
from relaykv.router.prompt import Prompt


@dataclass(slots=True)
class Decision:
    """One routing choice, kept in `Routing.recent` and shown by `GET /routing?recent=1`:
    the per-request record that tells routing losses from cache losses (docs/routing.md)."""

    role: str
    engine: str
    prefix: str  # the prompt's first block key (hex, 12 digits): equal prompts' heads match
    prompt_tokens: int
    scored_hit: int  # the usable hit the policy saw there (-1: only a bound was computed)
    cached_tokens: int | None = None  # the engine's own report (prefill: its usage)
    # The path (decode choices): "local" (D prefills it) or "pd"; why; D's local suffix
    # (prompt minus its hybrid-exact local hit; -1 unknown, None not computed)
    path: str = "pd"
    why: str = ""
    local_suffix: int | None = None


class Choice:
    """One engine chosen for one request (see the module docstring)."""

    __slots__ = (
        "_entry", "_index", "_prefixes", "_prompt", "backend", "hit_bound", "local_prefill",
        "record",
    )

    def __init__(
        self,
        backend: Backend,
        record: Decision,
        prompt: Prompt | None,
        index: EngineIndex | None,
        prefixes: InFlightPrefixes,
        hit_bound: int = 0,
    ) -> None:
        self.backend = backend
        self.hit_bound = hit_bound  # the upper bound of the usable hit the policy scored
        self.record = record
        self._prompt = prompt
        self._index = index  # the engine's index, kept current by its events (None: none)
        self._prefixes = prefixes
        self._entry: InFlight | None = None
        self.local_prefill = 0  # prompt tokens the engine computes itself (a local request)

    @property
    def index(self) -> EngineIndex | None:
        return self._index

    @property
    def prompt(self) -> Prompt | None:
        return self._prompt

    def __enter__(self) -> Choice:
        self._entry = InFlight(self._prefixes, self.backend.url, self._prompt, self.local_prefill)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._entry is not None
        self._entry.__exit__(*exc)

    async def prefix_loaded(self) -> None:
        """Before a decode engine takes the prompt: wait (bounded) for the loads of the same
        prefix that went there earlier (router/pending.py)."""
        if self._prompt is not None and self._index is not None and self._entry is not None:
            await self._prefixes.wait_for_load(self.backend, self._prompt, self._index, self._entry)

    def until_first(self, chunks: AsyncIterable[Any]) -> AsyncIterator[Any]:
        """`chunks`, keeping the prompt in flight here until the first of them arrives."""
        assert self._entry is not None
        return self._entry.until_first(chunks)

    def note_answer(self, answer: Any) -> Any:
        """Record the engine's own `cached_tokens` from its answer; returns the answer."""
        try:
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        except (KeyError, TypeError):
            cached = None
        self.record.cached_tokens = cached if type(cached) is int else None
        return answer
