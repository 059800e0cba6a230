"""relaykv.bench: benchmark clients for OpenAI-compatible servers (a client layer).

`bench serve` is a streaming load generator flag- and output-compatible with
`vllm bench serve` (docs/benchmarking.md);
`probe` is the fixed-engine cache probe of the upstream report (vLLM PR #56449); `bench ab`
runs one workload against several cluster configurations in A/B/A order.

Layering (docs/architecture.md): this package talks to servers over HTTP only and imports nothing
else from relaykv but the shared floor (the datasets and arrivals in `common/workloads/`, the
SSE frames), so it benchmarks relaykv, vLLM and SGLang alike.
"""

from __future__ import annotations
