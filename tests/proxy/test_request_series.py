"""The per-request series expose exactly what prometheus_client's own Counter and Histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from proxy.observability.metrics import RequestSeries
from tiers.latency import LATENCY_BUCKETS

OBSERVED = [0.0001, 0.0005, 0.0007, 0.001, 0.003, 0.003, 0.2, 1.0, 7.5, 61.0, 400.0]


def _lines(registry: CollectorRegistry) -> set[str]:
    return {line for line in generate_latest(registry).decode().splitlines()
            if line and not line.startswith("#") and "_created" not in line}


def test_the_series_read_like_prometheus_clients_own_metrics() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    series = RequestSeries()
    ours.register(series)
    requests = Counter("ragproxy_requests_total", "r", ["route", "status", "cache_status"], registry=theirs)
    durations = Histogram("ragproxy_request_duration_seconds", "d", ["route", "cache_status"],
                          buckets=LATENCY_BUCKETS, registry=theirs)
    upstreams = Histogram("ragproxy_upstream_duration_seconds", "u", ["upstream"], buckets=LATENCY_BUCKETS,
                          registry=theirs)
    for i, seconds in enumerate(OBSERVED):
        route, status, cache = ("chat", 200, "MISS") if i % 3 else ("embeddings", 429, "HIT")
        series.answered(route, status, cache, seconds)
        requests.labels(route, str(status), cache).inc()
        durations.labels(route, cache).observe(seconds)
        series.upstream(f"replica-{i % 2}", seconds)
        upstreams.labels(f"replica-{i % 2}").observe(seconds)
    assert _lines(ours) == _lines(theirs)
    assert 'ragproxy_request_duration_seconds_bucket{cache_status="MISS",le="+Inf",route="chat"} 7.0' in _lines(ours)
