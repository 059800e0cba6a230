"""The Prometheus text reader: `_total` suffixes, label sets, escapes."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from relaykv.bench.prometheus import ExpositionError, counter_total, parse_samples

TEXT = r"""
# HELP vllm:prefix_cache_hits_total hits
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m",engine="0"} 10.0
vllm:prefix_cache_hits_total{engine="1",model_name="a \"quoted\", {odd} name"} 5
vllm:prefix_cache_hits_created{model_name="m",engine="0"} 1.7e9
relaykv:kv_bytes_received 1e3 1700000000000
vllm:kv_cache_usage_perc{model_name="m"} NaN
weird{le="+Inf"} +Inf
"""


def test_parses_labels_values_and_timestamps() -> None:
    samples = parse_samples(TEXT)
    assert samples[1].labels == (("engine", "1"), ("model_name", 'a "quoted", {odd} name'))
    assert samples[3].value == 1000.0
    assert math.isnan(samples[4].value)
    assert samples[5].value == math.inf


def test_counter_total_sums_label_sets_and_prefers_total() -> None:
    samples = parse_samples(TEXT)
    assert counter_total(samples, "vllm:prefix_cache_hits") == 15.0  # not _created
    assert counter_total(samples, "relaykv:kv_bytes_received") == 1000.0  # bare name
    assert counter_total(samples, "vllm:external_prefix_cache_hits") is None


def test_reads_prometheus_client_output() -> None:
    registry = CollectorRegistry()
    hits = Counter("vllm:prefix_cache_hits", "h", ["model_name"], registry=registry)
    hits.labels("a").inc(3)
    hits.labels("b").inc(4)
    samples = parse_samples(generate_latest(registry).decode())
    assert counter_total(samples, "vllm:prefix_cache_hits") == 7.0


@pytest.mark.parametrize("line", ['x{a="1" 3', "x", "x{a=1} 2", "x abc"])
def test_malformed_lines_raise(line: str) -> None:
    with pytest.raises(ExpositionError):
        parse_samples(line)
