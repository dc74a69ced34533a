"""Prometheus metrics of one proxy process (served by the admin app at ``/metrics``).

Names follow Prometheus conventions: counters end in ``_total``, durations are ``_seconds`` histograms, sizes
``_bytes``. Each :class:`Metrics` owns its registry, so several proxies in one test process never collide. Gauges
that mirror state owned elsewhere (tier sizes, breaker states, queue depth) are read at scrape time through
callbacks registered with :meth:`Metrics.gauge_callback`, so the hot path never updates them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


class _Histogram:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0


class RequestSeries(Collector):
    """The series every request updates, as plain numbers turned into metric families at scrape time:
    ``ragproxy_requests_total`` (route, status, cache_status), ``ragproxy_request_duration_seconds`` (route,
    cache_status) and ``ragproxy_upstream_duration_seconds`` (upstream).

    Why not prometheus_client's ``Counter`` and ``Histogram`` for these: each of their updates takes a lock and
    checks the metric's state, and a histogram walks its bounds in Python; for these three updates that was 7% of
    the instructions a pass-through request costs the proxy (callgrind, the request of ``loadtest.bench
    overhead``). Here an update is a dict lookup, a bisection and two additions. Updates come from the event loop's
    thread; a scrape copies what it reads.
    """

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.durations: dict[tuple[str, str], _Histogram] = {}
        self.upstreams: dict[str, _Histogram] = {}

    def answered(self, route: str, status: int, cache_status: str, seconds: float) -> None:
        """Count one answered request and its time to the last byte."""
        key = (route, str(status), cache_status)
        self.requests[key] = self.requests.get(key, 0) + 1
        histogram = self.durations.get((route, cache_status))
        if histogram is None:
            histogram = self.durations[(route, cache_status)] = _Histogram()
        histogram.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        histogram.total += seconds

    def upstream(self, upstream: str, seconds: float) -> None:
        """One upstream call's time."""
        histogram = self.upstreams.get(upstream)
        if histogram is None:
            histogram = self.upstreams[upstream] = _Histogram()
        histogram.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        histogram.total += seconds

    def collect(self) -> Iterable[CounterMetricFamily | HistogramMetricFamily]:
        requests = CounterMetricFamily("ragproxy_requests", "Data-plane requests answered",
                                       labels=["route", "status", "cache_status"])
        for labels, count in list(self.requests.items()):
            requests.add_metric(list(labels), count)
        yield requests
        durations = HistogramMetricFamily("ragproxy_request_duration_seconds", "Time to answer (until the last byte)",
                                          labels=["route", "cache_status"])
        for pair, histogram in list(self.durations.items()):
            durations.add_metric(list(pair), _buckets(histogram), histogram.total)
        yield durations
        upstreams = HistogramMetricFamily("ragproxy_upstream_duration_seconds", "Upstream call time",
                                          labels=["upstream"])
        for upstream, histogram in list(self.upstreams.items()):
            upstreams.add_metric([upstream], _buckets(histogram), histogram.total)
        yield upstreams


_LE = [floatToGoString(bound) for bound in (*LATENCY_BUCKETS, math.inf)]  # type: ignore[no-untyped-call]


def _buckets(histogram: _Histogram) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, as the exposition wants them."""
    running = 0
    buckets = []
    for le, count in zip(_LE, list(histogram.counts), strict=True):
        running += count
        buckets.append((le, float(running)))
    return buckets


class Metrics:
    """Every metric the proxy exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.per_request = RequestSeries()
        r.register(self.per_request)
        self.tier_lookups = Counter("ragproxy_cache_lookups_total", "Lookups per tier and result",
                                    ["tier", "result"], registry=r)
        self.tier_seconds = Histogram("ragproxy_cache_lookup_duration_seconds", "Time of one tier lookup",
                                      ["tier"], buckets=LATENCY_BUCKETS, registry=r)
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

    def child(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)``, remembered: the per-request path skips prometheus_client's label checks."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) > 10_000:  # label values come from config and status codes; a bound anyway
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return found  # type: ignore[return-value]

    def gauge_callback(self, name: str, text: str, labels: list[str], reader: GaugeReader) -> None:
        """Export ``reader()``'s values as gauge ``name`` at every scrape."""
        self._gauges.readers[name] = (text, labels, reader)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
