"""Prometheus metrics of one proxy process (served by the admin app at ``/metrics``).

Names follow Prometheus conventions: counters end in ``_total``, durations are ``_seconds`` histograms, sizes
``_bytes``. Each :class:`Metrics` owns its registry, so several proxies in one test process never collide. Gauges
that mirror state owned elsewhere (tier sizes, breaker states, queue depth) are read at scrape time through
callbacks registered with :meth:`Metrics.gauge_callback`, so the hot path never updates them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

GaugeReader = Callable[[], Iterable[tuple[dict[str, str], float]]]
M = TypeVar("M", Counter, Histogram)


class _CallbackGauges(Collector):
    def __init__(self) -> None:
        self.readers: dict[str, tuple[str, list[str], GaugeReader]] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        for name, (text, labels, reader) in self.readers.items():
            family = GaugeMetricFamily(name, text, labels=labels)
            for label_values, value in reader():
                family.add_metric([label_values[label] for label in labels], value)
            yield family


class Metrics:
    """Every metric the proxy exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ragproxy_requests_total", "Data-plane requests answered",
                                ["route", "status", "cache_status"], registry=r)
        self.request_seconds = Histogram("ragproxy_request_duration_seconds", "Time to answer (until the last byte)",
                                         ["route", "cache_status"], buckets=LATENCY_BUCKETS, registry=r)
        self.tier_lookups = Counter("ragproxy_cache_lookups_total", "Lookups per tier and result",
                                    ["tier", "result"], registry=r)
        self.tier_seconds = Histogram("ragproxy_cache_lookup_duration_seconds", "Time of one tier lookup",
                                      ["tier"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_seconds = Histogram("ragproxy_upstream_duration_seconds", "Upstream call time",
                                          ["upstream"], buckets=LATENCY_BUCKETS, registry=r)
        self.events = Counter("ragproxy_cache_events_total",
                              "Admissions, evictions, bypasses, demotions, promotions, coalesced requests",
                              ["tier", "event"], registry=r)
        self.cost_saved = Counter("ragproxy_cost_saved_seconds_total",
                                  "Upstream seconds not spent thanks to cache hits", ["tier"], registry=r)
        self.credits_charged = Counter("ragproxy_credits_charged_total", "Credits charged to users",
                                       ["kind"], registry=r)
        self.prefix_tokens = Counter("ragproxy_kv_cached_prompt_tokens_total",
                                     "Prompt tokens the backends reported as served from their KV cache",
                                     ["backend"], registry=r)
        self.failures = Counter("ragproxy_dependency_failures_total", "Failures of a cache dependency (fail-open)",
                                ["dependency"], registry=r)
        self._gauges = _CallbackGauges()
        r.register(self._gauges)
        self._children: dict[tuple[int, tuple[str, ...]], Counter | Histogram] = {}
        self._answered: dict[tuple[str, int, str], tuple[Counter, Histogram]] = {}

    def child(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)``, remembered: the per-request path skips prometheus_client's label checks."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) > 10_000:  # label values come from config and status codes; a bound anyway
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return found  # type: ignore[return-value]

    def answered(self, route: str, status: int, cache_status: str, seconds: float) -> None:
        """Count one answered request and observe its duration (the per-request path: one lookup for both)."""
        key = (route, status, cache_status)
        pair = self._answered.get(key)
        if pair is None:
            if len(self._answered) > 10_000:
                self._answered.clear()
            pair = self._answered[key] = (self.requests.labels(route, str(status), cache_status),
                                          self.request_seconds.labels(route, cache_status))
        pair[0].inc()
        pair[1].observe(seconds)

    def gauge_callback(self, name: str, text: str, labels: list[str], reader: GaugeReader) -> None:
        """Export ``reader()``'s values as gauge ``name`` at every scrape."""
        self._gauges.readers[name] = (text, labels, reader)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
