"""`GET /metrics`: Prometheus text read from the engine at scrape time.

A custom collector (no counters are kept twice): cache counters from `engine.manager.stats`
(docs/design.md §9), request and latency figures from `engine.metrics`, queue sizes from the
scheduler. Every unlabelled family is one row of a table below (`COUNTERS`, `GAUGES`,
`HISTOGRAMS`: vLLM's per-request and per-iteration histograms with vLLM's buckets); the
labelled ones are built in `EngineCollector._labelled` (`vllm:prompt_tokens_by_source`,
`vllm:request_success`, `relaykv:group_prefix_tokens/_bytes`, `relaykv:kv_cache_blocks`).
Names are vLLM's (docs/metrics.md) plus relaykv's own; every series has the label `model_name`;
prometheus_client writes counters with a `_total` suffix. The engine thread updates plain
integers and fixed bucket arrays while we read, so a scrape may be one event behind, never
corrupt; histogram `+Inf` is computed from the bucket array itself so it equals `_count`.
The full list with meanings is docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

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


Read = Callable[[LLMEngine], float]

# (name, help, read) per unlabelled counter; prometheus_client appends `_total`.
COUNTERS: tuple[tuple[str, str, Read], ...] = (
    (
        "vllm:prefix_cache_queries",
        "Prompt tokens looked up in the local prefix cache.",
        lambda e: e.manager.stats.prefix_cache_queries,
    ),
    (
        "vllm:prefix_cache_hits",
        "Prompt tokens reused from the local prefix cache.",
        lambda e: e.manager.stats.prefix_cache_hits,
    ),
    (
        "vllm:external_prefix_cache_queries",
        "Prompt tokens asked of another engine (P/D).",
        lambda e: e.manager.stats.external_prefix_cache_queries,
    ),
    (
        "vllm:external_prefix_cache_hits",
        "Prompt tokens received from another engine (P/D).",
        lambda e: e.manager.stats.external_prefix_cache_hits,
    ),
    (
        "vllm:spec_decode_num_drafts",
        "Speculative verification steps with drafts.",
        lambda e: e.metrics.spec_num_drafts,
    ),
    (
        "vllm:spec_decode_num_draft_tokens",
        "Draft tokens verified.",
        lambda e: e.metrics.spec_num_draft_tokens,
    ),
    (
        "vllm:spec_decode_num_accepted_tokens",
        "Draft tokens accepted.",
        lambda e: e.metrics.spec_num_accepted_tokens,
    ),
    (
        "vllm:prompt_tokens",
        "Prompt tokens of admitted requests.",
        lambda e: e.metrics.prompt_tokens,
    ),
    ("vllm:generation_tokens", "Generated tokens.", lambda e: e.metrics.generation_tokens),
    (
        "vllm:num_preemptions",
        "Requests preempted (recompute).",
        lambda e: e.scheduler.num_preemptions,
    ),
    (
        "relaykv:kv_bytes_received",
        "KV bytes received from prefill engines.",
        lambda e: e.manager.stats.kv_bytes_received,
    ),
    (
        "relaykv:kv_bytes_from_tier",
        "Prompt KV bytes a decode engine loaded from its KV tier instead of a prefill engine.",
        lambda e: e.manager.stats.kv_bytes_from_tier,
    ),
    (
        "relaykv:kv_bytes_sent",
        "KV bytes sent to decode engines.",
        lambda e: e.manager.stats.kv_bytes_sent,
    ),
    (
        "relaykv:kv_coalesced_loads",
        "Remote KV loads served by an in-flight load.",
        lambda e: e.manager.stats.loads_coalesced,
    ),
    (
        "relaykv:kv_lease_expiries",
        "Held prefill blocks released by lease expiry.",
        lambda e: e.manager.stats.lease_expiries,
    ),
    (
        "relaykv:kv_failed_loads",
        "Remote KV loads that failed.",
        lambda e: e.manager.stats.loads_failed,
    ),
    (
        "relaykv:decode_local_requests",
        "Requests a decode engine prefilled itself (sent without KV).",
        lambda e: e.metrics.local_requests,
    ),
    (
        "relaykv:decode_local_prefill_tokens",
        "Prompt tokens a decode engine scheduled to compute itself.",
        lambda e: e.metrics.local_prefill_tokens,
    ),
)
GAUGES: tuple[tuple[str, str, Read], ...] = (
    (
        "vllm:kv_cache_usage_perc",
        "Fraction of KV blocks held by requests (1 = full).",
        lambda e: e.manager.pool.usage(),
    ),
    (
        "vllm:num_requests_running",
        "Requests in the running batch.",
        lambda e: len(e.scheduler.running),
    ),
    (
        "vllm:num_requests_waiting",
        "Requests waiting (for admission or for remote KV).",
        lambda e: (
            len(e.scheduler.waiting)
            + len(e.scheduler.loading)
            + len(e.scheduler.ready)
            + len(e.scheduler.tier_loading)
        ),
    ),
)
# (name, help, EngineMetrics attribute): vLLM's histograms with vLLM's buckets, then ours.
HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("vllm:time_to_first_token_seconds", "Time to first token.", "ttft"),
    ("vllm:e2e_request_latency_seconds", "End-to-end request latency.", "e2e"),
    ("vllm:inter_token_latency_seconds", "Time between streamed outputs.", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Decode time per output token.", "tpot"),
    ("vllm:request_queue_time_seconds", "Arrival to first scheduled.", "queue"),
    ("vllm:request_prefill_time_seconds", "First scheduled to first token.", "prefill"),
    ("vllm:request_decode_time_seconds", "First token to finish.", "decode"),
    ("vllm:request_inference_time_seconds", "First scheduled to finish.", "inference"),
    ("vllm:request_prompt_tokens", "Prompt tokens per request.", "request_prompt_tokens"),
    (
        "vllm:request_generation_tokens",
        "Generated tokens per request.",
        "request_generation_tokens",
    ),
    (
        "vllm:request_prefill_kv_computed_tokens",
        "Prompt tokens computed here per request (neither cached nor received).",
        "request_prefill_kv_computed_tokens",
    ),
    ("vllm:iteration_tokens_total", "Tokens computed per engine step.", "iteration_tokens"),
    ("relaykv:kv_transfer_seconds", "Remote KV load time (start to settled).", "kv_transfer"),
)


class EngineCollector(Collector):
    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def _family(self, kind: type, name: str, doc: str, *labels: str) -> Metric:
        return kind(name, doc, labels=["model_name", *labels])

    def collect(self) -> Iterator[Metric]:
        engine, name = self.engine, [self.model_name]
        for metric, doc, read in COUNTERS:
            family = self._family(CounterMetricFamily, metric, doc)
            family.add_metric(name, read(engine))
            yield family
        for metric, doc, read in GAUGES:
            family = self._family(GaugeMetricFamily, metric, doc)
            family.add_metric(name, read(engine))
            yield family
        for metric, doc, attr in HISTOGRAMS:
            yield _histogram(metric, doc, name, getattr(engine.metrics, attr))
        yield from self._labelled(engine, name)
        yield from self._tier(engine, name)

    def _tier(self, engine: LLMEngine, name: list[str]) -> Iterator[Metric]:
        """The KV tier's families (docs/tier.md "Metrics"); none without a tier. Its hits
        count in vLLM's external prefix-cache counters and `external_kv_transfer`."""
        tier = engine.manager.tier
        if tier is None:
            return
        stats, index = tier.stats, tier.index
        by_direction = (
            (
                "relaykv:kv_offload_blocks",
                "KV blocks copied between the pool and the tier.",
                stats.blocks_stored,
                stats.blocks_loaded,
            ),
            (
                "relaykv:kv_offload_failed_jobs",
                "Tier jobs that failed (a failed load is recomputed).",
                stats.stores_failed,
                stats.loads_failed,
            ),
        )
        for metric, doc, stored, loaded in by_direction:
            family = self._family(CounterMetricFamily, metric, doc, "direction")
            family.add_metric([*name, "stored"], stored)
            family.add_metric([*name, "loaded"], loaded)
            yield family
        plain = (
            (
                CounterMetricFamily,
                "relaykv:kv_offload_skipped_checkpoints",
                "Offload boundaries the tier could not take (no room, blocks gone).",
                stats.checkpoints_skipped,
            ),
            (
                CounterMetricFamily,
                "relaykv:kv_offload_evicted_blocks",
                "Tier blocks let go (evicted leaves, dropped checkpoints).",
                index.evicted_blocks,
            ),
            (
                GaugeMetricFamily,
                "relaykv:kv_offload_usage_perc",
                "Fraction of tier slots in use.",
                index.num_used / index.capacity if index.capacity else 0.0,
            ),
        )
        for kind, metric, doc, reading in plain:
            family = self._family(kind, metric, doc)
            family.add_metric(name, reading)
            yield family

    def _labelled(self, engine: LLMEngine, name: list[str]) -> Iterator[Metric]:
        stats, pool = engine.manager.stats, engine.manager.pool
        by_source = self._family(
            CounterMetricFamily,
            "vllm:prompt_tokens_by_source",
            "Prompt tokens by where their KV came from.",
            "source",
        )
        by_source.add_metric([*name, "local_compute"], stats.tokens_local_compute)
        by_source.add_metric([*name, "local_cache_hit"], stats.tokens_local_cache_hit)
        by_source.add_metric([*name, "external_kv_transfer"], stats.tokens_external_kv_transfer)
        yield by_source
        success = self._family(
            CounterMetricFamily,
            "vllm:request_success",
            "Finished requests by finish reason.",
            "finished_reason",
        )
        for reason, count in sorted(dict(engine.metrics.requests_finished).items()):
            success.add_metric([*name, reason], count)
        yield success
        tokens = self._family(
            CounterMetricFamily,
            "relaykv:group_prefix_tokens",
            "Prefix tokens reused per KV group, local or received.",
            "group",
            "source",
        )
        nbytes = self._family(
            CounterMetricFamily,
            "relaykv:group_prefix_bytes",
            "Prefix KV bytes reused per KV group, local or received.",
            "group",
            "source",
        )
        for g in range(stats.num_groups):
            tokens.add_metric([*name, str(g), "local"], stats.group_local_tokens[g])
            tokens.add_metric([*name, str(g), "received"], stats.group_received_tokens[g])
            nbytes.add_metric([*name, str(g), "local"], stats.group_local_bytes[g])
            nbytes.add_metric([*name, str(g), "received"], stats.group_received_bytes[g])
        yield tokens
        yield nbytes
        blocks = self._family(
            GaugeMetricFamily,
            "relaykv:kv_cache_blocks",
            "KV pool blocks (the null block excluded).",
            "state",
        )
        blocks.add_metric([*name, "total"], pool.num_usable)
        blocks.add_metric([*name, "free"], pool.num_free)
        yield blocks


def engine_registry(engine: LLMEngine, model_name: str) -> CollectorRegistry:
    """A registry of its own per server (tests run several in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry
