"""The fixed-engine correctness probe of the upstream report, vLLM PR #56449 (docs/design.md
§11; docs/benchmarking.md "relaykv probe").

Two prompts x+a and x+b share a long prefix x (random token ids from one seeded
generator: x, then a, then b, redrawing b if it equals a). Each is sent with
`max_tokens=1` to the router, in three phases: (1) `first_load`: x+a once; (2) `serial`:
x+a, then x+b after it finished; (3) `overlap`: x+a and x+b at the same time. Around every
phase the decode engines' counters are read (their URLs given, or from relaykv's router's
`/cluster`), and
the deltas say where D's prompt tokens came from: its local prefix cache, an external load
(P/D transfer), and how many KV bytes it received.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from relaykv.bench.client import ApiTarget, send_request
from relaykv.bench.engine_counters import (
    ClusterUrls,
    Counters,
    counter_deltas,
    fetch_cluster,
    scrape_counters,
)
from relaykv.bench.outcome import RequestOutcome
from relaykv.bench.runner import new_session
from relaykv.bench.server_info import ServerError
from relaykv.common.workloads import SampleRequest

PHASES: tuple[str, ...] = ("first_load", "serial", "overlap")
REPORTED: tuple[str, ...] = ("local_hit_tokens", "external_hit_tokens", "kv_bytes_received")


@dataclass(slots=True)
class PhaseResult:
    name: str
    local_hit_tokens: int
    external_hit_tokens: int
    kv_bytes_received: int
    requests_ok: int

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


@dataclass(slots=True)
class ProbeReport:
    phases: list[PhaseResult]
    requests_sent: dict[str, int]
    errors: list[str] = field(default_factory=list)
    missing_counters: list[str] = field(default_factory=list)
    decode_urls: tuple[str, ...] = ()

    def as_json(self) -> dict[str, list[dict[str, int | str]]]:
        """Exactly `{"phases": [...]}` (the probe's published JSON shape)."""
        return {"phases": [p.as_dict() for p in self.phases]}

    @property
    def all_ok(self) -> bool:
        return all(p.requests_ok == self.requests_sent[p.name] for p in self.phases)


def probe_prompts(
    prefix_len: int, suffix_len: int, vocab_size: int, seed: int
) -> tuple[list[int], list[int]]:
    """(x + a, x + b): a shared prefix x and two different suffixes."""
    if prefix_len < 0:
        raise ValueError(f"--prefix-len must be >= 0, got {prefix_len}")
    if suffix_len < 1:
        raise ValueError(f"--suffix-len must be >= 1 (x+a and x+b must differ), got {suffix_len}")
    if vocab_size < 2:
        raise ValueError(f"--vocab-size must be >= 2, got {vocab_size}")
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab_size, size=prefix_len).tolist()
    a = rng.integers(0, vocab_size, size=suffix_len).tolist()
    b = rng.integers(0, vocab_size, size=suffix_len).tolist()
    while b == a:
        b = rng.integers(0, vocab_size, size=suffix_len).tolist()
    return x + a, x + b


async def run_probe(
    target: ApiTarget,
    router_url: str,
    prompts: tuple[list[int], list[int]],
    *,
    settle_s: float = 0.5,
    log: Callable[[str], None] = lambda _: None,
    cluster: ClusterUrls | None = None,
) -> ProbeReport:
    """Run the three phases against `target` (the router) and read D's counters.

    The decode URLs come from `cluster` when given, else from the router's `/cluster`.
    """
    if cluster is None:
        try:
            cluster = await fetch_cluster(router_url)
        except ServerError as exc:
            raise ServerError(
                f"{exc} (a front end other than relaykv's router, such as vllm-router, has no "
                "/cluster: name the engines with --prefill URL --decode URL)"
            ) from None
    if not cluster.decode:
        log("warning: /cluster lists no decode engine; counters will read 0")
    xa, xb = (SampleRequest(p, 1) for p in prompts)
    phases: list[PhaseResult] = []
    errors: list[str] = []
    missing: set[str] = set()
    sent: dict[str, int] = {}
    async with new_session(None) as session:

        async def phase(name: str, send: Callable[[], Awaitable[list[RequestOutcome]]]) -> None:
            before = await scrape_counters(cluster.decode)
            outcomes = await send()
            if settle_s > 0:
                await asyncio.sleep(settle_s)  # let engines publish the last step's stats
            after = await scrape_counters(cluster.decode)
            delta = counter_deltas(before, after)
            errors.extend(f"{name}: {o.error}" for o in outcomes if not o.success)
            phases.append(_phase_result(name, delta, outcomes, missing))
            sent[name] = len(outcomes)
            log(f"phase {name}: {sum(o.success for o in outcomes)}/{len(outcomes)} ok")

        async def first_load() -> list[RequestOutcome]:
            return [await send_request(session, target, xa)]

        async def serial() -> list[RequestOutcome]:
            first = await send_request(session, target, xa)
            return [first, await send_request(session, target, xb)]

        async def overlap() -> list[RequestOutcome]:
            return list(
                await asyncio.gather(
                    send_request(session, target, xa), send_request(session, target, xb)
                )
            )

        for name, send in zip(PHASES, (first_load, serial, overlap), strict=True):
            await phase(name, send)
    return ProbeReport(phases, sent, errors, sorted(missing), cluster.decode)


def _phase_result(
    name: str, delta: Counters, outcomes: list[RequestOutcome], missing: set[str]
) -> PhaseResult:
    values: dict[str, int] = {}
    for key in REPORTED:
        if delta[key] is None:
            missing.add(key)
        values[key] = round(delta[key] or 0)
    return PhaseResult(name=name, requests_ok=sum(o.success for o in outcomes), **values)
