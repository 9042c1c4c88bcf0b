"""Prometheus metrics of the HTTP gateway (served at ``GET /metrics``).

Every gateway has its own :class:`prometheus_client.CollectorRegistry`, so several gateways can live in
one process (tests) without clashing in the global registry. Label values come from small fixed sets
(route templates, HTTP status codes, the gateway's error codes, reply statuses), never from request
data, so the number of series is bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["GatewayMetrics"]

# HTTP round trips: from sub-millisecond answers (429, cached replies) to the reply deadline.
_HTTP_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Submit → reply through Kafka and the cluster (the gateway's view of server-side latency).
_TXN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """The gateway's counters, gauges and histograms, in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "styx_gateway_requests", "HTTP requests answered", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "styx_gateway_request_duration_seconds",
            "HTTP request duration, from the first byte handled to the response start",
            ["route"],
            buckets=_HTTP_BUCKETS_S,
            registry=r,
        )
        self.in_flight = Gauge("styx_gateway_requests_in_flight", "HTTP requests being handled", registry=r)
        self.errors = Counter(
            "styx_gateway_errors",
            "error responses by HTTP status and error code",
            ["status", "code"],
            registry=r,
        )
        self.transactions = Histogram(
            "styx_gateway_transaction_duration_seconds",
            "time from handing a request to the cluster to its reply, by reply status",
            ["status"],
            buckets=_TXN_BUCKETS_S,
            registry=r,
        )
        self.pending = Gauge(
            "styx_gateway_pending_invocations", "invocations waiting for their reply", registry=r
        )
        self.cached = Gauge("styx_gateway_cached_replies", "replies held for idempotent retries", registry=r)
        self.lookups = Counter(
            "styx_gateway_reply_lookups",
            "reply lookups sent to the cluster (each asks every worker, for up to 64 request ids)",
            registry=r,
        )
        self.lookup_ids = Counter(
            "styx_gateway_reply_lookup_ids", "request ids looked up in the cluster's reply tables", registry=r
        )

        # Labelled children by label values: ``labels()`` costs a few µs a call, twice per request.
        self._children: dict[tuple[Any, ...], Any] = {}

    def request_latency(self, route: str) -> Histogram:
        """The latency histogram of ``route`` (a route template: the set is bounded)."""
        key = ("latency", route)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.latency.labels(route)
        return child

    def request_count(self, method: str, route: str, status: int) -> Counter:
        """The request counter of ``method`` ``route`` ``status`` (bounded sets)."""
        key = ("requests", method, route, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(method, route, str(status))
        return child

    def track(self, pending: Callable[[], int], cached: Callable[[], int]) -> None:
        """Read the size gauges from the gateway's tables at scrape time (nothing to update per request)."""
        self.pending.set_function(lambda: float(pending()))
        self.cached.set_function(lambda: float(cached()))

    def lookup(self, ids: int) -> None:
        self.lookups.inc()
        self.lookup_ids.inc(ids)

    def error(self, status: int, code: str) -> None:
        self.errors.labels(str(status), code).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
