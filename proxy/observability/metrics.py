"""Prometheus metrics of one proxy process (served by the admin app at ``/metrics``).

Names follow Prometheus conventions: counters end in ``_total``, durations are ``_seconds`` histograms, sizes
``_bytes``. Each :class:`Metrics` owns its registry, so several proxies in one test process never collide. Gauges
that mirror state owned elsewhere (tier sizes, breaker states, queue depth) are read at scrape time through
callbacks registered with :meth:`Metrics.gauge_callback`, so the hot path never updates them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from proxy.core.cache_tier import GaugeReader
from tiers.latency import LatencyHistogram

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
        self.durations: dict[tuple[str, str], LatencyHistogram] = {}
        self.upstreams: dict[str, LatencyHistogram] = {}

    def answered(self, route: str, status: int, cache_status: str, seconds: float) -> None:
        """Count one answered request and its time to the last byte."""
        key = (route, str(status), cache_status)
        self.requests[key] = self.requests.get(key, 0) + 1
        histogram = self.durations.get((route, cache_status))
        if histogram is None:
            histogram = self.durations[(route, cache_status)] = LatencyHistogram()
        histogram.observe(seconds)

    def upstream(self, upstream: str, seconds: float) -> None:
        """One upstream call's time."""
        histogram = self.upstreams.get(upstream)
        if histogram is None:
            histogram = self.upstreams[upstream] = LatencyHistogram()
        histogram.observe(seconds)

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


def _buckets(histogram: LatencyHistogram) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, as the exposition wants them."""
    return [(floatToGoString(bound), float(count)) for bound, count in histogram.cumulative()]  # type: ignore[no-untyped-call]


LookupReader = Callable[[], Iterable[tuple[str, Mapping[str, int], LatencyHistogram]]]
"""Per cache tier: its name, lookups per result, and the lookups' durations."""


class TierLookups(Collector):
    """``ragproxy_cache_lookups_total`` (tier, result) and ``ragproxy_cache_lookup_duration_seconds`` (tier), read
    from the tiers' own counters at scrape time (nothing on the request path but the tiers' counting)."""

    def __init__(self, read: LookupReader) -> None:
        self.read = read

    def collect(self) -> Iterable[CounterMetricFamily | HistogramMetricFamily]:
        lookups = CounterMetricFamily("ragproxy_cache_lookups", "Lookups per tier and result",
                                      labels=["tier", "result"])
        durations = HistogramMetricFamily("ragproxy_cache_lookup_duration_seconds", "Time of one tier lookup",
                                          labels=["tier"])
        for tier, results, seconds in self.read():
            for result, count in results.items():
                lookups.add_metric([tier, result], count)
            durations.add_metric([tier], _buckets(seconds), seconds.total)
        yield lookups
        yield durations

class Metrics:
    """Every metric the proxy exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.per_request = RequestSeries()
        r.register(self.per_request)
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
