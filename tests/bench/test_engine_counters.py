"""Reading /cluster and summing /metrics counters over engines."""

from __future__ import annotations

import pytest

from relaykv.bench.engine_counters import (
    COUNTERS,
    counter_deltas,
    fetch_cluster,
    parse_cluster,
    scrape_counters,
)
from relaykv.bench.server_info import ServerError, parse_models
from tests.bench.stub_cluster import BYTES_PER_TOKEN, EngineState, ServerThread


async def test_counters_sum_over_engines_and_label_sets() -> None:
    with ServerThread(EngineState()) as one, ServerThread(EngineState()) as two:
        one.state.admit(list(range(33)))  # 32 reusable: external 32
        two.state.blocks.add(tuple(range(16)))
        two.state.admit(list(range(40)))  # 32 reusable: local 16, external 16
        two.state.local.labels("other-model").inc(5)  # a second label set
        totals = await scrape_counters([one.url, two.url])
        assert await fetch_cluster(one.url) == parse_cluster(
            {"router": one.url, "prefill": [], "decode": [one.url]}
        )
    assert totals["local_hit_tokens"] == 21
    assert totals["external_hit_tokens"] == 48
    assert totals["kv_bytes_received"] == 48 * BYTES_PER_TOKEN
    assert totals["local_query_tokens"] == 73
    assert totals["kv_bytes_sent"] is None  # no engine exposes it
    assert set(totals) == set(COUNTERS)


async def test_unreachable_engine_is_a_server_error() -> None:
    with pytest.raises(ServerError, match="/metrics"):
        await scrape_counters(["http://127.0.0.1:9"])
    assert await scrape_counters([]) == dict.fromkeys(COUNTERS)


def test_deltas_treat_a_counter_that_appeared_as_starting_at_zero() -> None:
    before = {**dict.fromkeys(COUNTERS), "local_hit_tokens": 10.0}
    after = {**dict.fromkeys(COUNTERS), "local_hit_tokens": 25.0, "external_hit_tokens": 7.0}
    deltas = counter_deltas(before, after)
    assert deltas["local_hit_tokens"] == 15.0
    assert deltas["external_hit_tokens"] == 7.0
    assert deltas["kv_bytes_received"] is None


def test_cluster_and_models_validation() -> None:
    urls = parse_cluster({"router": "http://r/", "prefill": ["http://p/"], "decode": []})
    assert (urls.router, urls.prefill, urls.decode) == ("http://r", ("http://p",), ())
    with pytest.raises(ServerError):
        parse_cluster({"router": "http://r", "decode": "http://d"})
    with pytest.raises(ServerError):
        parse_cluster([1, 2])
    model = parse_models({"data": [{"id": "m", "vocab_size": 7, "owned_by": "relaykv"}]})
    assert (model.id, model.vocab_size, model.is_relaykv) == ("m", 7, True)
    assert parse_models({"data": [{"id": "m", "vocab_size": "x"}]}).vocab_size is None
    with pytest.raises(ServerError, match="no model"):
        parse_models({"data": []})
