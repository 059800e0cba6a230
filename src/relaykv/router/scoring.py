"""A prompt scored on each engine of a role, and the policy's choice (docs/routing.md "Cost").

Pure and clock-free: the router (`Routing.pick`) and the simulator (`relaykv.sim.routing`) call
the same function, so both make the same decisions. Each engine is a `EngineView`: its index
(None: judged on load alone), its load, and the resume point the prefixes this router has in
flight there give (`computing`, router/pending.py). Every engine gets a cheap upper bound of
its usable hit (`EngineIndex.hit_bound`); the cache-aware policy then asks for the exact hit
(kvcache's lookup, `EngineIndex.usable_hit`) only while a bound can still win
(`CacheAwarePolicy.choose_lazy`), which makes the choice a full evaluation makes. Engines
sharing their role's holders map (router/holders.py) take their bounds and their lookups'
full-group runs from one pass over the prompt's keys there (`Prompt.counts_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from relaykv.router.holders import PromptCounts
from relaykv.router.index import EngineIndex
from relaykv.router.policy import CacheAwarePolicy, Candidate, RoutingPolicy
from relaykv.router.prompt import Prompt


@dataclass(slots=True)
class EngineView:
    """One engine as scored for one prompt (not frozen: a router builds one per engine per
    decision, and a frozen dataclass sets each field through `object.__setattr__`, 2-4
    times slower here; docs/routing.md "Cost")."""

    index: EngineIndex | None  # what it holds (None: judged on load alone)
    in_flight: int  # requests this router has in flight there
    waiting: int = 0  # the engine's own queue
    kv_usage: float = 0.0
    computing: int = 0  # the resume point prefixes in flight there give the prompt


class Scored(NamedTuple):
    """The policy's choice: an index into the views, with the usable hit it saw there."""

    choice: int
    exact: int | None  # the exact usable hit there (None: the policy needed only a bound)
    bound: int  # the upper bound the choice was made with

    @property
    def scored_hit(self) -> int:
        """The hit a decision record shows: exact, else -1 (only a bound was computed)."""
        if self.exact is not None:
            return self.exact
        return -1 if self.bound else 0


def choose_engine(
    policy: RoutingPolicy, prompt: Prompt | None, views: Sequence[EngineView]
) -> Scored:
    """Score `prompt` on every view and let `policy` choose (`views` is not empty)."""
    if prompt is not None:
        prompt.recount()  # events since an earlier decision (a retry) change the holders
    n = len(prompt.tokens) if prompt is not None else 0
    counts: list[Callable[[int], PromptCounts] | None] = [None] * len(views)
    candidates = []
    for i, view in enumerate(views):
        index = view.index
        bound, blocks = 0, 0
        if index is not None:
            blocks = index.num_blocks
            if prompt is not None:
                found = counts[i] = prompt.counts_for(index)
                bound = max(index.hit_bound(prompt.request_for(index), found), view.computing)
        # positional: hit_tokens, prompt_tokens, in_flight, waiting, kv_usage, cached_blocks
        candidates.append(
            Candidate(bound, n, view.in_flight, view.waiting, view.kv_usage, blocks)
        )
    exact: dict[int, int] = {}

    def exact_hit(i: int) -> int:
        index = views[i].index
        assert prompt is not None and index is not None
        hit = index.usable_hit(prompt.request_for(index), counts[i])
        exact[i] = max(hit, views[i].computing)
        return exact[i]

    if isinstance(policy, CacheAwarePolicy) and prompt is not None:
        choice = policy.choose_lazy(candidates, exact_hit)
    else:
        choice = policy.choose(candidates)
    return Scored(choice, exact.get(choice), candidates[choice].hit_tokens)
