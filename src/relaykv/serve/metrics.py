"""`GET /metrics`: Prometheus text read from the engine at scrape time.

A custom collector (no counters are kept twice): cache counters from
`engine.manager.stats` (docs/design.md §9), request and latency figures from `engine.metrics`,
queue sizes from the scheduler. Names are vLLM's (docs/metrics.md) plus relaykv's own; every
series has the label `model_name`. prometheus_client writes counters with a `_total` suffix
(readers accept `name` and `name_total`). The engine thread updates plain integers and
fixed bucket arrays while we read, so a scrape may be one event behind, never corrupt;
histogram `+Inf` is computed from the bucket array itself so it always equals `_count`.

| name | type | source |
|---|---|---|
| vllm:prefix_cache_queries / _hits | counter | stats.prefix_cache_queries / _hits |
| vllm:external_prefix_cache_queries / _hits | counter | stats.external_prefix_cache_* |
| vllm:prompt_tokens_by_source{source} | counter | local_compute, local_cache_hit, external_kv_... |
| vllm:kv_cache_usage_perc | gauge | pool.usage() (0..1, as vLLM) |
| vllm:num_requests_running / _waiting | gauge | scheduler (waiting includes remote-KV loads) |
| vllm:time_to_first_token_seconds | histogram | metrics.ttft |
| vllm:e2e_request_latency_seconds | histogram | metrics.e2e |
| vllm:inter_token_latency_seconds | histogram | metrics.itl |
| vllm:spec_decode_num_drafts / _draft_tokens / _accepted_tokens | counter | metrics.spec_* |
| vllm:prompt_tokens / vllm:generation_tokens | counter | metrics |
| vllm:request_success{finished_reason} | counter | metrics.requests_finished |
| vllm:num_preemptions | counter | scheduler.num_preemptions |
| relaykv:kv_bytes_received / _sent | counter | stats.kv_bytes_* |
| relaykv:kv_transfer_seconds | histogram | metrics.kv_transfer (remote KV loads) |
| relaykv:kv_coalesced_loads, kv_lease_expiries, kv_failed_loads | counter | stats |
| relaykv:group_prefix_tokens{group,source=local/received} | counter | stats.group_*_tokens |
| relaykv:group_prefix_bytes{group,source=local/received} | counter | stats.group_*_bytes |
| relaykv:kv_cache_blocks{state=total/free} | gauge | pool |
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from relaykv.engine import Histogram, LLMEngine


def _histogram(name: str, doc: str, labels: list[str], hist: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["model_name"])
    counts = list(hist.counts)
    buckets, running = [], 0
    for bound, count in zip(hist.buckets, counts, strict=False):
        running += count
        buckets.append((repr(float(bound)), running))
    buckets.append(("+Inf", sum(counts)))
    family.add_metric(labels, buckets, sum_value=hist.total)
    return family


class EngineCollector(Collector):
    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family

    def collect(self) -> Iterator[Metric]:
        engine, name = self.engine, [self.model_name]
        stats, m, sched = engine.manager.stats, engine.metrics, engine.scheduler
        pool = engine.manager.pool
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the local prefix cache.",
            stats.prefix_cache_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens reused from the local prefix cache.",
            stats.prefix_cache_hits,
        )
        yield self._counter(
            "vllm:external_prefix_cache_queries",
            "Prompt tokens asked of another engine (P/D).",
            stats.external_prefix_cache_queries,
        )
        yield self._counter(
            "vllm:external_prefix_cache_hits",
            "Prompt tokens received from another engine (P/D).",
            stats.external_prefix_cache_hits,
        )
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Prompt tokens by where their KV came from.",
            labels=["model_name", "source"],
        )
        by_source.add_metric([*name, "local_compute"], stats.tokens_local_compute)
        by_source.add_metric([*name, "local_cache_hit"], stats.tokens_local_cache_hit)
        by_source.add_metric([*name, "external_kv_transfer"], stats.tokens_external_kv_transfer)
        yield by_source
        yield self._gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction of KV blocks held by requests (1 = full).",
            pool.usage(),
        )
        yield self._gauge(
            "vllm:num_requests_running", "Requests in the running batch.", len(sched.running)
        )
        yield self._gauge(
            "vllm:num_requests_waiting",
            "Requests waiting (for admission or for remote KV).",
            len(sched.waiting) + len(sched.loading),
        )
        yield _histogram("vllm:time_to_first_token_seconds", "Time to first token.", name, m.ttft)
        yield _histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", name, m.e2e
        )
        yield _histogram(
            "vllm:inter_token_latency_seconds", "Time between streamed outputs.", name, m.itl
        )
        yield self._counter(
            "vllm:spec_decode_num_drafts",
            "Speculative verification steps with drafts.",
            m.spec_num_drafts,
        )
        yield self._counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens verified.", m.spec_num_draft_tokens
        )
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Draft tokens accepted.",
            m.spec_num_accepted_tokens,
        )
        yield self._counter(
            "vllm:prompt_tokens", "Prompt tokens of admitted requests.", m.prompt_tokens
        )
        yield self._counter("vllm:generation_tokens", "Generated tokens.", m.generation_tokens)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Finished requests by finish reason.",
            labels=["model_name", "finished_reason"],
        )
        for reason, count in sorted(dict(m.requests_finished).items()):
            success.add_metric([*name, reason], count)
        yield success
        yield self._counter(
            "vllm:num_preemptions", "Requests preempted (recompute).", sched.num_preemptions
        )
        yield self._counter(
            "relaykv:kv_bytes_received",
            "KV bytes received from prefill engines.",
            stats.kv_bytes_received,
        )
        yield self._counter(
            "relaykv:kv_bytes_sent", "KV bytes sent to decode engines.", stats.kv_bytes_sent
        )
        yield _histogram(
            "relaykv:kv_transfer_seconds",
            "Remote KV load time (start to settled).",
            name,
            m.kv_transfer,
        )
        yield self._counter(
            "relaykv:kv_coalesced_loads",
            "Remote KV loads served by an in-flight load.",
            stats.loads_coalesced,
        )
        yield self._counter(
            "relaykv:kv_lease_expiries",
            "Held prefill blocks released by lease expiry.",
            stats.lease_expiries,
        )
        yield self._counter(
            "relaykv:kv_failed_loads", "Remote KV loads that failed.", stats.loads_failed
        )
        tokens = CounterMetricFamily(
            "relaykv:group_prefix_tokens",
            "Prefix tokens reused per KV group, local or received.",
            labels=["model_name", "group", "source"],
        )
        nbytes = CounterMetricFamily(
            "relaykv:group_prefix_bytes",
            "Prefix KV bytes reused per KV group, local or received.",
            labels=["model_name", "group", "source"],
        )
        for g in range(stats.num_groups):
            tokens.add_metric([*name, str(g), "local"], stats.group_local_tokens[g])
            tokens.add_metric([*name, str(g), "received"], stats.group_received_tokens[g])
            nbytes.add_metric([*name, str(g), "local"], stats.group_local_bytes[g])
            nbytes.add_metric([*name, str(g), "received"], stats.group_received_bytes[g])
        yield tokens
        yield nbytes
        blocks = GaugeMetricFamily(
            "relaykv:kv_cache_blocks",
            "KV pool blocks (the null block excluded).",
            labels=["model_name", "state"],
        )
        blocks.add_metric([*name, "total"], pool.num_usable)
        blocks.add_metric([*name, "free"], pool.num_free)
        yield blocks


def engine_registry(engine: LLMEngine, model_name: str) -> CollectorRegistry:
    """A registry of its own per server (tests run several in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry
