"""Routing policies: which engine of a role takes a request (docs/routing.md).

A policy is a pure, clock-free object: `choose(candidates)` looks only at the numbers it is
given (each candidate's usable hit and load) and at its own turn counter, so the simulator
(`relaykv sim`) runs the very same decisions on a virtual clock.

Contract: `candidates` is non-empty and holds only engines that may take the request;
`choose` returns an index into it and never raises.

`CacheAwarePolicy` (the default) scores each engine

    score = hit_weight * hit_tokens / prompt_tokens
            - load_weight * (load - least load among candidates)
            - kv_weight * kv_usage

where `load = in_flight + queue_weight * waiting` (requests this router has in flight there
plus the engine's own queue, which also counts other routers' work). Engines whose load
after taking the request would exceed `max_load_ratio` times the mean load (the new request
included, and at least one request per engine) are skipped unless every engine is,
so a hot prefix spreads: a usable hit is worth at most `hit_weight / load_weight` extra
requests in flight. Scores within 0.005 of the best are ties: the engine whose cache holds
the fewest blocks wins them (new prefixes spread over the caches), then round robin.

`ConditionalRule` decides the path of a request once its decode engine is chosen
(conditional disaggregation, docs/routing.md "Conditional disaggregation"): under
`conditional`, the request goes straight to that decode engine, which prefills it itself (a
local request), when it holds part of the prompt (a usable hybrid-exact hit: the engine
serves the siblings of what it holds) and the suffix that hit leaves is at most
`max_suffix` tokens and the local prefill this router has queued there, this suffix
included, stays within `max_queued_prefill` and at most `max_running` of this router's
streams decode there (requests asking for more than one token: a local prefill holds up each
of them for a step, P/D keeps their inter-token latency, so a D that decodes gets its
siblings through P; the default 0 means a local prefill never stalls a stream); otherwise
P -> D.
`always` is P -> D for every request, `never` local for every one (colocated-style, decode
engines only).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

ROUTING_MODES: tuple[str, ...] = ("cache-aware", "least-loaded", "round-robin")
DISAGGREGATION_MODES: tuple[str, ...] = ("conditional", "always", "never")
# The cost estimate behind the default (docs/routing.md "Conditional disaggregation"): the P
# trip's fixed cost (two more HTTP hops, P's step, the grant, the transfer and D's load step)
# against D's own prefill rate in chunks of `--max-local-prefill-tokens` (256): below about
# two chunks, D computing the suffix costs less than the trip saves.
DEFAULT_CONDITIONAL_MAX_SUFFIX = 512
# What the engines' sibling reach adds to the max suffix: a sibling of a parent whose own
# suffix is at most the max suffix resumes within max suffix + 2 alignment units of the
# parent's end (the resume point rounds down to the alignment; an EAGLE draft drops one
# more unit); 512 covers the largest alignment of relaykv's presets (dsv4-flash, 256).
SIBLING_REACH_MARGIN = 512


def default_sibling_reach(max_suffix: int) -> int:
    """The engines' `--sibling-reach` that lets decode engines serve siblings under a rule
    with this max suffix (`relaykv up` and the simulator set it)."""
    return max_suffix + SIBLING_REACH_MARGIN


# Per decode engine, local prefill tokens queued by this router (not yet answered), this
# suffix included: by default the max suffix itself (`ConditionalRule.queue_cap`). The max
# suffix is what D prefills in the time the P trip takes, so a local request's wait behind
# the local prefill queued there plus its own prefill stays within the trip it saves; a
# burst of siblings spills over to P, which computes in parallel (docs/routing.md: the
# simulator's c8/output1 with 4,096 queued tokens put every sibling on D, -6% throughput
# on dsv4-flash, +49% with the default).
# Per decode engine, this router's streams there (requests in flight that ask for more than
# one token, from the decode call until their last token) for it to still take a local
# request: the local prefill stalls each of them one step. Zero: a local prefill never lands
# on a D that decodes; with one allowed, 2 of 8 gsp c4 siblings went local and cost the
# streams 14.8% of their throughput and +36.8% P99 ITL (docs/routing.md, measured).
DEFAULT_CONDITIONAL_MAX_RUNNING = 0
# Scores this close count as tied (round robin): a 1.7% difference in KV usage (kv_weight
# 0.3) is noise from the last metrics scrape, while one block of a 2k-token prompt's hit
# (0.7%) still counts.
_EPS = 0.005


class Candidate(NamedTuple):
    """One engine as a policy sees it for one request (a named tuple, not a frozen
    dataclass: a router builds one per engine per decision, and a frozen dataclass's
    `__init__` sets each field through `object.__setattr__`, 2-4 times slower here;
    docs/routing.md "Cost")."""

    hit_tokens: int = 0  # usable prompt tokens already held there (0 when unknown)
    prompt_tokens: int = 0
    in_flight: int = 0  # requests this router has in flight there
    waiting: int = 0  # the engine's own queue (its metrics; 0 when unknown)
    kv_usage: float = 0.0  # fraction of the engine's KV pool in use (0..1)
    cached_blocks: int = 0  # blocks its index holds (a tie goes to the emptiest cache)


@dataclass(frozen=True, slots=True)
class CacheAwareWeights:
    hit_weight: float = 1.0
    load_weight: float = 0.2
    kv_weight: float = 0.3
    queue_weight: float = 1.0
    max_load_ratio: float = 2.0

    def __post_init__(self) -> None:
        for name in ("hit_weight", "load_weight", "kv_weight", "queue_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.max_load_ratio < 1:
            raise ValueError("max_load_ratio must be >= 1")


class RoutingPolicy(Protocol):
    name: str

    def choose(self, candidates: Sequence[Candidate]) -> int: ...


class _Turns:
    def __init__(self) -> None:
        self._turn = itertools.count()

    def tie(self, tied: list[int]) -> int:
        return tied[next(self._turn) % len(tied)]


class RoundRobinPolicy(_Turns):
    name = "round-robin"

    def choose(self, candidates: Sequence[Candidate]) -> int:
        return self.tie(list(range(len(candidates))))


class LeastLoadedPolicy(_Turns):
    """Fewest requests in flight through this router (ties round robin): the old default."""

    name = "least-loaded"

    def choose(self, candidates: Sequence[Candidate]) -> int:
        least = min(c.in_flight for c in candidates)
        return self.tie([i for i, c in enumerate(candidates) if c.in_flight == least])


class CacheAwarePolicy(_Turns):
    name = "cache-aware"

    def __init__(self, weights: CacheAwareWeights | None = None) -> None:
        super().__init__()
        self.weights = weights or CacheAwareWeights()

    def choose(self, candidates: Sequence[Candidate]) -> int:
        return self.choose_lazy(candidates, lambda i: candidates[i].hit_tokens)

    def choose_lazy(self, candidates: Sequence[Candidate], exact: Callable[[int], int]) -> int:
        """`choose` where `candidates[i].hit_tokens` is only an upper bound and `exact(i)`
        gives the true hit: engines are scored best bound first and `exact` is asked only
        while a bound can still reach the best exact score, so the choice (ties included)
        is the one `choose` makes on exact hits."""
        w = self.weights
        qw = w.queue_weight  # an engine's load: in flight here + queue_weight * waiting
        loads = [c.in_flight + qw * c.waiting for c in candidates]
        # The mean counts the new request; below one request per engine it counts as one, so
        # a nearly idle cluster still lets a request join the engine holding its prefix.
        mean_after = max(1.0, (sum(loads) + 1) / len(loads))
        cap = w.max_load_ratio * mean_after
        eligible = [i for i, load in enumerate(loads) if load + 1 <= cap]
        if not eligible:
            eligible = list(range(len(candidates)))
        least = min(loads[i] for i in eligible)

        def score(i: int, hit_tokens: int) -> float:
            c = candidates[i]
            hit = hit_tokens / c.prompt_tokens if c.prompt_tokens > 0 else 0.0
            load = w.load_weight * (loads[i] - least)
            return w.hit_weight * hit - load - w.kv_weight * c.kv_usage

        bounds = sorted(((score(i, candidates[i].hit_tokens), i) for i in eligible), reverse=True)
        best = float("-inf")
        scores: dict[int, float] = {}
        for bound, i in bounds:
            if bound < best - _EPS:
                break
            hit = candidates[i].hit_tokens
            scores[i] = score(i, exact(i) if hit > 0 else 0)
            best = max(best, scores[i])
        tied = [i for i, s in scores.items() if s >= best - _EPS]
        # New prefixes (no hit anywhere) go to the engine caching the least, so prefixes
        # spread over the engines' caches; equal ones take turns.
        fewest = min(candidates[i].cached_blocks for i in tied)
        return self.tie(sorted(i for i in tied if candidates[i].cached_blocks == fewest))


class PathChoice(NamedTuple):
    """Where a request's prompt is computed: `local` (the decode engine itself) or `pd` (a
    named tuple, as `Candidate`)."""

    local: bool
    suffix: int  # prompt tokens the decode engine would compute itself (-1: unknown)
    why: str

    @property
    def path(self) -> str:
        return "local" if self.local else "pd"


@dataclass(frozen=True, slots=True)
class ConditionalRule:
    """The path rule of conditional disaggregation (module docstring)."""

    mode: str = "conditional"
    max_suffix: int = DEFAULT_CONDITIONAL_MAX_SUFFIX
    max_queued_prefill: int | None = None  # None: the max suffix (`queue_cap`)
    max_running: int = DEFAULT_CONDITIONAL_MAX_RUNNING

    def __post_init__(self) -> None:
        if self.mode not in DISAGGREGATION_MODES:
            raise ValueError(
                f"disaggregation must be one of {', '.join(DISAGGREGATION_MODES)}, "
                f"got {self.mode!r}"
            )
        if self.max_suffix < 0:
            raise ValueError(f"conditional_max_suffix must be >= 0, got {self.max_suffix}")
        if self.max_queued_prefill is not None and self.max_queued_prefill < 0:
            raise ValueError(
                f"conditional_max_queued_prefill must be >= 0, got {self.max_queued_prefill}"
            )
        if self.max_running < 0:
            raise ValueError(f"conditional_max_running must be >= 0, got {self.max_running}")

    @property
    def queue_cap(self) -> int:
        """The most local prefill tokens this router queues on one decode engine."""
        return self.max_suffix if self.max_queued_prefill is None else self.max_queued_prefill

    def settled_by_bound(self, prompt_tokens: int, hit_bound: int) -> PathChoice | None:
        """The path `decide` gives whatever the exact hit, when an upper bound of it already
        settles it (P -> D: nothing held there, or a suffix of at least `prompt_tokens -
        hit_bound` tokens, above the max suffix), so the router skips the exact lookup; None
        when only the exact hit can tell. The suffix is then only bounded: -1 (unknown)."""
        if self.mode != "conditional" or prompt_tokens <= 0:
            return None
        if hit_bound <= 0:
            return PathChoice(False, prompt_tokens, "no usable hit on the decode engine")
        least = prompt_tokens - hit_bound
        if least > self.max_suffix:
            return PathChoice(False, -1, f"suffix >= {least} > max suffix {self.max_suffix}")
        return None

    def decide(
        self, prompt_tokens: int, hit_tokens: int | None, queued_prefill: int, streams: int = 0
    ) -> PathChoice:
        """The path of a `prompt_tokens`-token prompt whose usable hit on the chosen decode
        engine is `hit_tokens` (None: unknown, the prompt was not read) while this router
        has `queued_prefill` local prompt tokens queued there and `streams` requests in
        flight there that decode past their first token (not counting this one)."""
        suffix = prompt_tokens - hit_tokens if hit_tokens is not None else -1
        if self.mode == "never":
            return PathChoice(True, suffix, "--disaggregation never")
        if self.mode == "always":
            return PathChoice(False, suffix, "--disaggregation always")
        if suffix < 0:
            return PathChoice(False, suffix, "no usable hit known (prompt not tokenized)")
        if hit_tokens == 0:
            return PathChoice(False, suffix, "no usable hit on the decode engine")
        if suffix > self.max_suffix:
            return PathChoice(False, suffix, f"suffix {suffix} > max suffix {self.max_suffix}")
        if queued_prefill + suffix > self.queue_cap:
            return PathChoice(
                False,
                suffix,
                f"queued local prefill {queued_prefill} + {suffix} > {self.queue_cap}",
            )
        if streams > self.max_running:
            return PathChoice(
                False, suffix, f"{streams} streams decoding there > max running {self.max_running}"
            )
        return PathChoice(True, suffix, f"suffix {suffix} <= max suffix {self.max_suffix}")


def make_policy(mode: str, weights: CacheAwareWeights | None = None) -> RoutingPolicy:
    if mode == "cache-aware":
        return CacheAwarePolicy(weights)
    if mode == "least-loaded":
        return LeastLoadedPolicy()
    if mode == "round-robin":
        return RoundRobinPolicy()
    raise ValueError(f"unknown routing mode {mode!r}; choose from {', '.join(ROUTING_MODES)}")
