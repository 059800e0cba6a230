"""/metrics: vLLM and relaykv names, label model_name, counters that move with traffic."""

from __future__ import annotations

import httpx

from relaykv.bench.prometheus import Sample, counter_total, parse_samples

NAMES = [
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:prompt_tokens_by_source",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds",
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "relaykv:kv_bytes_received",
    "relaykv:kv_bytes_from_tier",
    "relaykv:kv_bytes_sent",
    "relaykv:kv_transfer_seconds",
    "relaykv:kv_coalesced_loads",
    "relaykv:kv_lease_expiries",
    "relaykv:kv_failed_loads",
    "relaykv:decode_local_requests",
    "relaykv:decode_local_prefill_tokens",
    "relaykv:group_prefix_tokens",
    "relaykv:group_prefix_bytes",
]


def scrape(http: httpx.Client) -> list[Sample]:
    r = httpx.get(http.base_url.join("/metrics"))  # no API key needed
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return parse_samples(r.text)


def value(samples: list[Sample], name: str, **labels: str) -> float:
    total = 0.0
    for s in samples:
        if s.name in (name, f"{name}_total") and all(
            dict(s.labels).get(k) == v for k, v in labels.items()
        ):
            total += s.value
    return total


def test_every_documented_name_is_exposed_with_model_name(http: httpx.Client) -> None:
    samples = scrape(http)
    for name in NAMES:
        found = [s for s in samples if s.name.startswith(name)]
        assert found, name
        assert all(dict(s.labels).get("model_name") == "reference" for s in found), name


def test_counters_move_with_requests(http: httpx.Client) -> None:
    before = scrape(http)
    prompt = list(range(1, 81))
    for _ in range(2):  # the resend hits the prefix cache
        r = http.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 5, "ignore_eos": True}
        )
        assert r.status_code == 200
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    after = scrape(http)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("vllm:prefix_cache_queries") == 160
    assert delta("vllm:prefix_cache_hits") == cached
    assert delta("vllm:prompt_tokens_by_source", source="local_cache_hit") == cached
    assert delta("vllm:prompt_tokens_by_source", source="local_compute") == 160 - cached
    assert delta("vllm:generation_tokens") == 10
    assert delta("vllm:request_success", finished_reason="length") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("relaykv:group_prefix_tokens", group="0", source="local") == cached
    # the sliding group (W=10, b=4) reuses only its window's blocks, not the whole prefix
    sliding = delta("relaykv:group_prefix_tokens", group="1", source="local")
    assert 0 < sliding < cached
    assert delta("relaykv:group_prefix_bytes", group="1", source="local") == sliding * 8
    assert counter_total(after, "vllm:prefix_cache_hits") == value(after, "vllm:prefix_cache_hits")
    assert value(after, "vllm:num_requests_running") == 0
    hist = [s for s in after if s.name == "vllm:time_to_first_token_seconds_bucket"]
    inf = next(s for s in hist if dict(s.labels)["le"] == "+Inf")
    assert inf.value == value(after, "vllm:time_to_first_token_seconds_count")


def test_tier_hits_count_as_external_and_tier_families_appear() -> None:
    """A prompt whose blocks the small pool let go comes back from the KV tier: vLLM's
    external counters and `external_kv_transfer` count it, relaykv's tier families move,
    and the reference executor (which reads its KV from the pages) answers the same."""
    from prometheus_client import CollectorRegistry, generate_latest

    from relaykv.common.messages.steps import SamplingParams
    from relaykv.serve.api.metrics import EngineCollector

    from ..harness import reference_served

    served = reference_served(num_blocks=90, max_model_len=128, kv_offloading_size=0.001)
    engine = served.engine
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    first = [1 + i % 50 for i in range(100)]
    try:
        out = [r.output_ids for r in engine.generate([first], params)]
        for i in range(3):  # other prompts push the first one out of the pool
            engine.generate([[60 + i] * 100], params)
        again = engine.generate([[*first, 7]], params)[0]
        assert again.num_cached_tokens >= 96  # the hit came back (from the tier)
        assert engine.generate([first], params)[0].output_ids == out[0]
        registry = CollectorRegistry()
        registry.register(EngineCollector(engine, "reference"))
        samples = parse_samples(generate_latest(registry).decode())
    finally:
        assert engine.manager.tier is not None
        engine.manager.tier.shutdown()
    assert value(samples, "vllm:external_prefix_cache_hits") > 0
    assert value(samples, "vllm:prompt_tokens_by_source", source="external_kv_transfer") > 0
    assert value(samples, "relaykv:kv_offload_blocks", direction="loaded") > 0
    assert value(samples, "relaykv:kv_offload_blocks", direction="stored") > 0
    assert 0 < value(samples, "relaykv:kv_offload_usage_perc") < 1
