"""Reading a cluster's engines: `GET /cluster` on the router, `GET /metrics` on engines.

Contract (docs/benchmarking.md "What the servers must provide"): the router
answers `/cluster` with `{"router": URL, "prefill": [URL], "decode": [URL]}`; every engine
serves Prometheus text at `/metrics`. Counters are summed over label sets and engines.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from relaykv.bench.prometheus import ExpositionError, counter_total, parse_samples
from relaykv.bench.server_info import ServerError, fetch_json

# short name -> Prometheus counter name (docs/metrics.md)
COUNTERS: dict[str, str] = {
    "local_hit_tokens": "vllm:prefix_cache_hits",
    "local_query_tokens": "vllm:prefix_cache_queries",
    "external_hit_tokens": "vllm:external_prefix_cache_hits",
    "external_query_tokens": "vllm:external_prefix_cache_queries",
    "kv_bytes_received": "relaykv:kv_bytes_received",
    "kv_bytes_sent": "relaykv:kv_bytes_sent",
    "local_requests": "relaykv:decode_local_requests",  # conditional disaggregation
}

Counters = dict[str, float | None]


@dataclass(frozen=True, slots=True)
class ClusterUrls:
    router: str
    prefill: tuple[str, ...]
    decode: tuple[str, ...]


def parse_cluster(body: object, router: str = "") -> ClusterUrls:
    """`{"router": URL, "prefill": [URL], "decode": [URL]}` -> ClusterUrls."""
    if not isinstance(body, dict):
        raise ServerError("cluster description is not a JSON object")

    def urls(key: str) -> tuple[str, ...]:
        value = body.get(key, [])
        if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
            raise ServerError(f"cluster description: {key!r} must be a list of URLs")
        return tuple(u.rstrip("/") for u in value)

    router_url = body.get("router", router)
    if not isinstance(router_url, str) or not router_url:
        raise ServerError("cluster description has no router URL")
    return ClusterUrls(
        router=router_url.rstrip("/"), prefill=urls("prefill"), decode=urls("decode")
    )


async def fetch_cluster(router_url: str) -> ClusterUrls:
    body = await fetch_json(f"{router_url.rstrip('/')}/cluster")
    return parse_cluster(body, router_url)


async def _metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    try:
        async with session.get(
            f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=30)
        ) as response:
            if response.status != 200:
                raise ServerError(f"GET {url}/metrics: HTTP {response.status}")
            return await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ServerError(f"GET {url}/metrics failed: {type(exc).__name__}: {exc}") from exc


async def scrape_counters(engine_urls: tuple[str, ...] | list[str]) -> Counters:
    """Each counter summed over engines; None when no engine exposes it."""
    totals: Counters = dict.fromkeys(COUNTERS)
    if not engine_urls:
        return totals
    async with aiohttp.ClientSession(trust_env=False) as session:
        texts = await asyncio.gather(*(_metrics_text(session, u) for u in engine_urls))
    for url, text in zip(engine_urls, texts, strict=True):
        try:
            samples = parse_samples(text)
        except ExpositionError as exc:
            raise ServerError(f"{url}/metrics: {exc}") from exc
        for short, name in COUNTERS.items():
            value = counter_total(samples, name)
            if value is not None:
                totals[short] = (totals[short] or 0.0) + value
    return totals


def counter_deltas(before: Counters, after: Counters) -> Counters:
    """after - before per counter; None when `after` lacks it.

    A counter absent before but present after counts from 0: labelled Prometheus counters
    only appear once a label set is first used, which may be during the measured phase.
    """
    deltas: Counters = {}
    for key in COUNTERS:
        end = after.get(key)
        deltas[key] = None if end is None else end - (before.get(key) or 0.0)
    return deltas
