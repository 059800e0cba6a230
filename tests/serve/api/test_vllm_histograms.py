"""vLLM's per-request and iteration histograms (names and buckets) and the Grafana dashboard:
every metric docs/grafana/relaykv.json queries exists on a running engine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from relaykv.engine.metrics import REQUEST_LATENCY_BUCKETS, token_buckets

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana" / "relaykv.json"
HISTOGRAMS = {
    "vllm:request_prompt_tokens": 5,
    "vllm:request_generation_tokens": 4,
    "vllm:request_prefill_kv_computed_tokens": None,
    "vllm:request_queue_time_seconds": None,
    "vllm:request_prefill_time_seconds": None,
    "vllm:request_decode_time_seconds": None,
    "vllm:request_inference_time_seconds": None,
    "vllm:request_time_per_output_token_seconds": None,
    "vllm:e2e_request_latency_seconds": None,
    "vllm:iteration_tokens_total": None,
}


def _families(http: httpx.Client) -> dict:
    text = httpx.get(http.base_url.join("/metrics")).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_vllm_histograms_with_vllms_buckets(http: httpx.Client) -> None:
    before = _families(http)
    r = http.post("/v1/completions", json={"prompt": [3, 4, 5, 6, 7], "max_tokens": 4})
    assert r.status_code == 200
    after = _families(http)
    for name, observed in HISTOGRAMS.items():
        family = after[name]
        assert family.type == "histogram", name

        def count(fams: dict, name: str = name) -> float:
            return next(s.value for s in fams[name].samples if s.name.endswith("_count"))

        if name != "vllm:iteration_tokens_total":  # one observation per finished request
            assert count(after) == count(before) + 1, name
        if observed is not None:  # the 5-token prompt and the 4 generated tokens

            def bucket(le: str, fams: dict = after, name: str = name) -> float:
                return next(s.value for s in fams[name].samples if s.labels.get("le") == le)

            assert bucket("5.0") - bucket("5.0", before) == 1
            assert bucket("2.0") - bucket("2.0", before) == (0 if observed > 2 else 1)
    assert count_steps(before) < count_steps(after)
    e2e = after["vllm:e2e_request_latency_seconds"].samples
    les = [s.labels["le"] for s in e2e if "le" in s.labels]
    assert les == [repr(float(b)) for b in REQUEST_LATENCY_BUCKETS] + ["+Inf"]
    assert token_buckets(512) == (1, 2, 5, 10, 20, 50, 100, 200, 500)


def count_steps(fams: dict) -> float:
    steps = fams["vllm:iteration_tokens_total"].samples
    return next(s.value for s in steps if s.name.endswith("_count"))


def test_every_metric_the_dashboard_queries_exists(http: httpx.Client) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = set(re.findall(r"(?:vllm|relaykv):[a-z0-9_]+", " ".join(exprs)))
    assert len(queried) >= 20
    samples = {
        s.name
        for f in text_string_to_metric_families(httpx.get(http.base_url.join("/metrics")).text)
        for s in f.samples
    }
    missing = sorted(q for q in queried if q not in samples)
    assert not missing, missing
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for panel in ("Time To First Token", "KV Bytes Received", "Lease Expiries", "External Hit"):
        assert panel in titles, panel
