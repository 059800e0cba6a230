"""The router's Prometheus metrics: every response it sends, counted where it is sent.

`CountResponses` wraps the whole app (an ASGI middleware outside FastAPI's routing and error
handlers), so every response is counted by status and endpoint: relayed engine answers, the
router's own 4xx and 503s, and a 500 from an unexpected exception, which passes through this
middleware as an exception and is counted before it propagates. `RouterCollector` writes them
with prometheus_client, so every family has its `# TYPE` line and counters their `_total`
samples (docs/metrics.md "Router metrics").

| name | type | labels |
|---|---|---|
| relaykv:router_requests | counter | generation requests received |
| relaykv:router_retries | counter | attempts moved to another engine after a failure |
| relaykv:router_responses | counter | endpoint, status: every response |
| relaykv:router_stream_errors | counter | decode streams that broke after they started |
| relaykv:router_engine_healthy | gauge | role, url: 1 in rotation, 0 out |
| relaykv:router_engine_in_flight | gauge | role, url: requests in flight through this router |
| relaykv:router_engine_streams | gauge | role, url: of those, asking for more than one token |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relaykv.router.backends import Backend

# Endpoints named in the `endpoint` label; any other path counts as "other" (bounded labels).
KNOWN_ENDPOINTS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/cluster", "/metrics"}
)


@dataclass(slots=True)
class RouterStats:
    requests: int = 0
    retries: int = 0
    stream_errors: int = 0
    responses: Counter[tuple[str, int]] = field(default_factory=Counter)

    def count_response(self, path: str, status: int) -> None:
        endpoint = path if path in KNOWN_ENDPOINTS else "other"
        if path.startswith("/v1/models/"):
            endpoint = "/v1/models/{id}"
        self.responses[(endpoint, status)] += 1


class CountResponses:
    """Counts every HTTP response of the wrapped app in `stats` (see module docstring)."""

    def __init__(self, app: ASGIApp, stats: RouterStats) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.stats.count_response(scope["path"], int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # the server error handler answers 500 after this
                self.stats.count_response(scope["path"], 500)
            raise


class RouterCollector(Collector):
    def __init__(self, stats: RouterStats, backends: Iterable[Backend]) -> None:
        self.stats = stats
        self.backends = list(backends)

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        for name, doc, value in (
            ("relaykv:router_requests", "Generation requests received.", s.requests),
            ("relaykv:router_retries", "Attempts moved to another engine.", s.retries),
            ("relaykv:router_stream_errors", "Decode streams broken mid-way.", s.stream_errors),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        responses = CounterMetricFamily(
            "relaykv:router_responses",
            "Responses sent, by endpoint and HTTP status.",
            labels=["endpoint", "status"],
        )
        for (endpoint, status), count in sorted(s.responses.items()):
            responses.add_metric([endpoint, str(status)], count)
        yield responses
        healthy = GaugeMetricFamily(
            "relaykv:router_engine_healthy",
            "1 while an engine is in rotation.",
            labels=["role", "url"],
        )
        in_flight = GaugeMetricFamily(
            "relaykv:router_engine_in_flight",
            "Requests in flight to an engine through this router.",
            labels=["role", "url"],
        )
        streams = GaugeMetricFamily(
            "relaykv:router_engine_streams",
            "Requests in flight to an engine through this router that ask for more than one "
            "token (streams it decodes), until their answer ends.",
            labels=["role", "url"],
        )
        for b in self.backends:
            healthy.add_metric([b.role, b.url], 1.0 if b.healthy else 0.0)
            in_flight.add_metric([b.role, b.url], b.in_flight)
            streams.add_metric([b.role, b.url], b.streams)
        yield healthy
        yield in_flight
        yield streams


def router_registry(stats: RouterStats, backends: Iterable[Backend]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RouterCollector(stats, backends))
    return registry
