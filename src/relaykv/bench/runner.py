"""Running a list of requests: warmups, arrival schedule, concurrency cap, progress bars.

vLLM's procedure (`benchmark` in vllm/benchmarks/serve.py): `--num-warmups` copies of the
first request go first (capped by `--max-concurrency`, not measured); then the measured
run sends each request at its arrival offset, at most `max_concurrency` in flight
(a semaphore, so a request's `start_time` is when it was actually sent), and the duration
is from the first arrival to the last completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import aiohttp
from tqdm import tqdm

from relaykv.bench.client import ApiTarget, send_request
from relaykv.bench.outcome import RequestOutcome
from relaykv.common.workloads import SampleRequest
from relaykv.common.workloads.arrivals import arrival_offsets


@dataclass(frozen=True, slots=True)
class LoadShape:
    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_warmups: int = 0
    seed: int = 0


@dataclass(slots=True)
class RunOutcome:
    outcomes: list[RequestOutcome]
    duration_s: float
    warmup_outcomes: list[RequestOutcome]


def new_session(max_concurrency: int | None) -> aiohttp.ClientSession:
    limit = max_concurrency or 0
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, force_close=False)
    return aiohttp.ClientSession(connector=connector, trust_env=False)


async def _send_all(
    session: aiohttp.ClientSession,
    target: ApiTarget,
    requests: list[SampleRequest],
    offsets: list[float],
    max_concurrency: int | None,
    bar: tqdm | None,
) -> list[RequestOutcome]:
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def one(request: SampleRequest) -> RequestOutcome:
        queued = time.perf_counter()
        async with gate:
            waited = time.perf_counter() - queued
            outcome = await send_request(session, target, request)
        outcome.client_queue_time = waited
        if bar is not None:
            bar.update(1)
        return outcome

    start = time.perf_counter()
    tasks = []
    for request, offset in zip(requests, offsets, strict=True):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(request)))
    return list(await asyncio.gather(*tasks))


async def run_requests(
    target: ApiTarget,
    requests: list[SampleRequest],
    shape: LoadShape,
    *,
    progress: bool = True,
    desc: str = "requests",
) -> RunOutcome:
    """Warm up, then send `requests` with the given load shape; never raises per request."""
    if not requests:
        raise ValueError("no requests to send")
    async with new_session(shape.max_concurrency) as session:
        warmups: list[RequestOutcome] = []
        if shape.num_warmups > 0:
            bar = tqdm(total=shape.num_warmups, desc="warmup", disable=not progress)
            warmups = await _send_all(
                session,
                target,
                [requests[0]] * shape.num_warmups,
                [0.0] * shape.num_warmups,
                shape.max_concurrency,
                bar,
            )
            bar.close()
        offsets = arrival_offsets(len(requests), shape.request_rate, shape.burstiness, shape.seed)
        bar = tqdm(total=len(requests), desc=desc, disable=not progress)
        start = time.perf_counter()
        outcomes = await _send_all(session, target, requests, offsets, shape.max_concurrency, bar)
        duration = time.perf_counter() - start
        bar.close()
    return RunOutcome(outcomes=outcomes, duration_s=duration, warmup_outcomes=warmups)
