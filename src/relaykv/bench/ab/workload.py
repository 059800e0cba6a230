"""The A/B workload: groups of prefix_repetition requests (the c1/output1 style of
the upstream report, vLLM PR #56449).

A group `cC/outputO:N` sends N prompts at concurrency C, each asking for O tokens, after
the warmups (copies of the group's first prompt asking for one token: their job is to put
the group's prefix in the caches, and a long-output group's warmup then costs no decode
time; unmeasured and not counted in the engine counters). Group i uses seed `seed + i`, so
groups do not share prefixes with each other and every configuration sees identical prompts.
A group written `gsp:cC/outputO:N` sends generated-shared-prefix prompts instead (SGLang's
dataset: `--num-prefixes` system prompts of `--prefix-len` tokens, N / num-prefixes questions
of `--suffix-len` tokens each, shuffled). Each group keeps its generated texts in request
order, so greedy runs of different configurations can be compared token for token.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from relaykv.bench.ab.host_cpu import CpuTimes, cpu_shares, read_cpu_times, summed_interval
from relaykv.bench.client import ApiTarget
from relaykv.bench.engine_counters import ClusterUrls, Counters, counter_deltas, scrape_counters
from relaykv.bench.metrics import compute_metrics
from relaykv.bench.outcome import RequestOutcome
from relaykv.bench.runner import LoadShape, run_requests
from relaykv.bench.serve.report import RunDescription, build_result
from relaykv.bench.server_info import ServerError
from relaykv.common.workloads import (
    SampleRequest,
    generated_shared_prefix_requests,
    prefix_repetition_requests,
)

GROUP_PATTERN = re.compile(r"^(?:(gsp):)?c(\d+)/output(\d+):(\d+)$")
DEFAULT_GROUPS: tuple[str, ...] = ("c1/output1:8", "c8/output1:40", "c8/output128:40")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    concurrency: int
    output_len: int
    num_prompts: int
    shared_prefix: bool = False  # generated-shared-prefix prompts (`gsp:`)

    @property
    def label(self) -> str:
        head = "gsp " if self.shared_prefix else ""
        return f"{head}c{self.concurrency}/output{self.output_len}"


def parse_group(text: str) -> GroupSpec:
    """`c8/output128:40` -> concurrency 8, 128 output tokens, 40 prompts (`gsp:` first:
    generated-shared-prefix prompts)."""
    match = GROUP_PATTERN.match(text.strip())
    if not match:
        raise ValueError(
            f"--groups: expected [gsp:]cCONCURRENCY/outputTOKENS:PROMPTS, got {text!r}"
        )
    dataset, *numbers = match.groups()
    concurrency, output_len, prompts = (int(g) for g in numbers)
    if concurrency < 1 or prompts < 1:
        raise ValueError(f"--groups: concurrency and prompts must be >= 1 in {text!r}")
    return GroupSpec(concurrency, output_len, prompts, shared_prefix=dataset == "gsp")


@dataclass(frozen=True, slots=True)
class Workload:
    groups: tuple[GroupSpec, ...]
    prefix_len: int = 8192
    suffix_len: int = 64
    num_prefixes: int = 1
    num_warmups: int = 1
    seed: int = 0
    percentiles: tuple[float, ...] = (99.0,)
    # per-request arrays and the engines' steps in each result (`--save-detailed`)
    detailed: bool = False


@dataclass(slots=True)
class GroupResult:
    group: str
    result: dict[str, Any]
    ttfts_ms: list[float]
    counters: dict[str, Counters]
    errors: list[str] = field(default_factory=list)
    outputs: list[str | None] = field(default_factory=list)  # generated texts, request order
    # the host's CPU while the group ran: steal_pct, busy_pct (host_cpu.py; {}: unknown)
    host: dict[str, float] = field(default_factory=dict)


async def _counters(cluster: ClusterUrls, log: Callable[[str], None]) -> dict[str, Counters | None]:
    out: dict[str, Counters | None] = {}
    for role, urls in (("prefill", cluster.prefill), ("decode", cluster.decode)):
        try:
            out[role] = await scrape_counters(urls)
        except ServerError as exc:
            log(f"warning: cannot read {role} counters: {exc}")
            out[role] = None
    return out


def _deltas(
    before: dict[str, Counters | None], after: dict[str, Counters | None]
) -> dict[str, Counters]:
    deltas: dict[str, Counters] = {}
    for role in ("prefill", "decode"):
        b, a = before.get(role), after.get(role)
        deltas[role] = counter_deltas(b, a) if b is not None and a is not None else {}
    return deltas


def group_requests(workload: Workload, index: int, vocab_size: int) -> list[SampleRequest]:
    """The measured requests of group `index` (the same for every configuration)."""
    group = workload.groups[index]
    if group.shared_prefix:
        return generated_shared_prefix_requests(
            vocab_size,
            num_groups=workload.num_prefixes,
            prompts_per_group=group.num_prompts // workload.num_prefixes,
            system_prompt_len=workload.prefix_len,
            question_len=workload.suffix_len,
            output_len=group.output_len,
            range_ratio=1.0,
            seed=workload.seed + index,
        )
    return prefix_repetition_requests(
        group.num_prompts,
        vocab_size,
        prefix_len=workload.prefix_len,
        suffix_len=workload.suffix_len,
        num_prefixes=workload.num_prefixes,
        output_len=group.output_len,
        seed=workload.seed + index,
    )


async def _warm_up(
    target: ApiTarget, workload: Workload, group: GroupSpec, first: SampleRequest, progress: bool
) -> None:
    if workload.num_warmups:
        await run_requests(
            target,
            [replace(first, output_len=1)] * workload.num_warmups,
            LoadShape(max_concurrency=group.concurrency),
            progress=progress,
            desc=f"{group.label} warmup",
        )


async def engine_steps(
    cluster: ClusterUrls, since: float, log: Callable[[str], None]
) -> dict[str, dict[str, list[Any]]]:
    """Per role and engine URL, the engine's steps that ended at or after `since` (`GET
    /steps`, docs/serving.md: times on the engine host's `time.perf_counter()`, the clock
    the client stamps requests with, so on one host a request's gaps line up with the
    steps that ran meanwhile). An engine without the endpoint is left out, with a warning."""
    out: dict[str, dict[str, list[Any]]] = {}
    async with aiohttp.ClientSession(trust_env=False) as session:
        for role, urls in (("prefill", cluster.prefill), ("decode", cluster.decode)):
            for url in urls:
                try:
                    async with session.get(f"{url}/steps", params={"since": repr(since)}) as r:
                        if r.status != 200:
                            raise ServerError(f"answered {r.status}")
                        steps = (await r.json())["steps"]
                except (aiohttp.ClientError, ServerError, ValueError, KeyError, TypeError) as exc:
                    log(f"warning: cannot read {url}/steps: {exc}")
                    continue
                out.setdefault(role, {})[url] = steps
    return out


def _group_result(
    workload: Workload,
    group: GroupSpec,
    target: ApiTarget,
    outcomes: list[RequestOutcome],
    duration_s: float,
    counters: dict[str, Counters],
    host: dict[str, float] | None,
    steps: dict[str, dict[str, list[Any]]] | None = None,
) -> GroupResult:
    metrics = compute_metrics(outcomes, duration_s, workload.percentiles)
    description = RunDescription(
        backend="openai",
        model_id=target.model,
        num_prompts=len(outcomes),
        request_rate=float("inf"),
        burstiness=1.0,
        max_concurrency=group.concurrency,
        label=group.label,
        percentile_metrics=("ttft", "tpot", "itl", "e2el"),
    )
    result = build_result(description, metrics, duration_s, outcomes, detailed=workload.detailed)
    if steps is not None:
        result["engine_steps"] = steps
    return GroupResult(
        group=group.label,
        result=result,
        ttfts_ms=[o.ttft * 1000 for o in outcomes if o.success],
        counters=counters,
        errors=[o.error for o in outcomes if not o.success][:10],
        outputs=[o.generated_text if o.success else None for o in outcomes],
        host=host or {},
    )


async def run_group(
    target: ApiTarget,
    cluster: ClusterUrls,
    workload: Workload,
    index: int,
    vocab_size: int,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> GroupResult:
    group = workload.groups[index]
    requests = group_requests(workload, index, vocab_size)
    await _warm_up(target, workload, group, requests[0], progress)
    shape = LoadShape(max_concurrency=group.concurrency, seed=workload.seed + index)
    before = await _counters(cluster, log)
    cpu_before = read_cpu_times()
    run = await run_requests(target, requests, shape, progress=progress, desc=group.label)
    host = cpu_shares(cpu_before, read_cpu_times())
    after = await _counters(cluster, log)
    counters = _deltas(before, after)
    steps = await _measured_steps(workload, cluster, run.outcomes, log)
    return _group_result(
        workload, group, target, run.outcomes, run.duration_s, counters, host, steps
    )


async def _measured_steps(
    workload: Workload,
    cluster: ClusterUrls,
    outcomes: list[RequestOutcome],
    log: Callable[[str], None],
) -> dict[str, dict[str, list[Any]]] | None:
    """With `--save-detailed`: the engines' steps since the first measured request."""
    if not workload.detailed or not outcomes:
        return None
    return await engine_steps(cluster, min(o.start_time for o in outcomes), log)


async def run_group_interleaved(
    targets: list[ApiTarget],
    clusters: list[ClusterUrls],
    workload: Workload,
    index: int,
    vocab_size: int,
    *,
    log: Callable[[str], None] = print,
) -> list[GroupResult]:
    """Group `index` on every run's cluster at once (`bench ab --interleave`): each run
    warms up, then the measured requests go in waves of the group's concurrency, every
    run's wave right after the others' (the run that goes first rotates from wave to
    wave), so the runs share the host's minutes and a slower stretch of the host slows
    each of them alike. One result per run, in `targets` order: its waves' requests in
    request order, its waves' durations summed, its own counters and CPU shares."""
    group = workload.groups[index]
    requests = group_requests(workload, index, vocab_size)
    for target in targets:
        await _warm_up(target, workload, group, requests[0], progress=False)
    n = len(targets)
    before = [await _counters(cluster, log) for cluster in clusters]
    outcomes: list[list[RequestOutcome]] = [[] for _ in range(n)]
    durations = [0.0] * n
    cpu: list[list[CpuTimes]] = [[] for _ in range(n)]
    shape = LoadShape(max_concurrency=group.concurrency, seed=workload.seed + index)
    waves = range(0, len(requests), group.concurrency)
    for w, start in enumerate(waves):
        wave = requests[start : start + group.concurrency]
        for k in range(n):
            i = (w + k) % n
            cpu_before = read_cpu_times()
            run = await run_requests(targets[i], wave, shape, progress=False)
            cpu_after = read_cpu_times()
            if cpu_before is not None and cpu_after is not None:
                cpu[i] += [cpu_before, cpu_after]
            outcomes[i] += run.outcomes
            durations[i] += run.duration_s
    results = []
    for i in range(n):
        counters = _deltas(before[i], await _counters(clusters[i], log))
        host = cpu_shares(*summed_interval(cpu[i])) if cpu[i] else None
        steps = await _measured_steps(workload, clusters[i], outcomes[i], log)
        results.append(
            _group_result(
                workload, group, targets[i], outcomes[i], durations[i], counters, host, steps
            )
        )
    return results


def count_differing_outputs(runs: list[dict[str, Any]]) -> None:
    """Set each run's groups' `differing_outputs`: how many requests generated other text
    than in the first run that has the same group (requests that failed in either are
    counted by `failed`, not here)."""
    first: dict[str, list[str | None]] = {}
    for run in runs:
        for group in run.get("groups", []):
            reference = first.setdefault(group["group"], group.get("outputs", []))
            pairs = zip(reference, group.get("outputs", []), strict=False)
            group["differing_outputs"] = sum(
                1 for a, b in pairs if a is not None and b is not None and a != b
            )
