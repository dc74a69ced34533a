"""Request statistics for the admin API: counts per route and tier, cost saved, coalescing, the hottest entries.

:class:`RequestStats` is fed one answered request at a time by ``Runtime.observe`` (with what the pipeline left on
the :class:`~proxy.core.context.RequestContext`) and read by ``GET /admin/stats``. It is pure: no I/O, no awaits, an
injectable clock, constant memory.

Counting rules (the outcome's status → bucket): ``HIT``/``SEMANTIC_HIT`` → ``hits`` (and the serving tier's
``hits``), ``MISS``/``REFRESH`` → ``misses`` (a coalesced follower is a miss with tier ``coalesced``, counted in
``coalesced`` too), ``BYPASS`` → ``bypasses``, ``ERROR`` → ``errors``, anything else (pass-through routes) only
in ``requests``. ``hit_ratio = hits / (hits + misses)`` — bypasses are not lookups.

Cost saved is the sum of the hit entries' ``cost`` (upstream seconds the answer took when it was produced). The
cost of a hit comes from the cost of the entry that answered (``ctx.entry``); otherwise from the
``upstream_seconds`` remembered when the same key missed in this process (a bounded map, :data:`COST_MEMORY`),
otherwise it is counted as unknown (``hits_without_cost``) rather than guessed.

Top entries: the Space-Saving algorithm (Metwally et al., 2005) over entry keys — ``capacity`` counters, each
key's count over-estimated by at most its ``error``; any key with more than ``total / capacity`` hits is
guaranteed to be listed. Written here (40 lines) rather than pulling a streaming-sketch library for one
structure. A time series of per-interval buckets (``interval_s``, last ``buckets``) lets the dashboard draw hit
ratio per tier over time without keeping history in the browser.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.core.outcome import COALESCED, HIT_STATUSES, MISS_STATUSES, CacheStatus

COST_MEMORY = 50_000
"""How many keys' upstream costs are remembered to price later hits."""


@dataclass(slots=True)
class Counts:
    """Counters of one route or one tier."""

    requests: int = 0
    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    errors: int = 0
    cost_saved_s: float = 0.0

    @property
    def hit_ratio(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "hits": self.hits, "misses": self.misses, "bypasses": self.bypasses,
                "errors": self.errors, "hit_ratio": round(self.hit_ratio, 6),
                "cost_saved_s": round(self.cost_saved_s, 6)}


@dataclass(slots=True)
class TopCounter:
    key: str
    count: int
    error: int
    label: dict[str, str]


class SpaceSaving:
    """Approximate top-k heavy hitters in ``capacity`` counters."""

    def __init__(self, capacity: int = 128) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.total = 0
        self._counters: dict[str, TopCounter] = {}

    def add(self, key: str, label: Mapping[str, str] | None = None) -> None:
        self.total += 1
        counter = self._counters.get(key)
        if counter is not None:
            counter.count += 1
            if label:
                counter.label.update(label)
            return
        if len(self._counters) < self.capacity:
            self._counters[key] = TopCounter(key, 1, 0, dict(label or {}))
            return
        smallest = min(self._counters.values(), key=lambda c: c.count)
        del self._counters[smallest.key]
        self._counters[key] = TopCounter(key, smallest.count + 1, smallest.count, dict(label or {}))

    def discard(self, key: str) -> None:
        """Forget ``key`` (its entry was deleted)."""
        self._counters.pop(key, None)

    def top(self, n: int) -> list[TopCounter]:
        return sorted(self._counters.values(), key=lambda c: (-c.count, c.key))[:n]


@dataclass(slots=True)
class Bucket:
    """One interval of the time series: lookups and hits per tier."""

    start: float
    requests: int = 0
    hits: int = 0
    misses: int = 0
    tier_hits: dict[str, int] = field(default_factory=dict)


class RequestStats:
    """Everything ``GET /admin/stats`` reports about answered requests (see the module docstring)."""

    def __init__(self, *, top_capacity: int = 128, interval_s: float = 10.0, buckets: int = 90,
                 clock: Callable[[], float] = time.time) -> None:
        self.routes: dict[str, Counts] = {}
        self.tiers: dict[str, Counts] = {}
        self.total = Counts()
        self.coalesced = 0
        self.hits_without_cost = 0
        self.top = SpaceSaving(top_capacity)
        self.interval_s = interval_s
        self.max_buckets = buckets
        self.series: list[Bucket] = []
        self.started = clock()
        self._clock = clock
        self._costs: OrderedDict[str, float] = OrderedDict()

    def record(self, *, route: str, cache_status: CacheStatus | None, tier: str | None, key: str | None,
               upstream_seconds: float | None = None, hit_cost: float | None = None,
               label: Mapping[str, str] | None = None) -> float:
        """Count one answered request; the cost it saved (0.0 unless a hit with a known cost)."""
        status = cache_status
        route_counts = self.routes.get(route)
        if route_counts is None:
            route_counts = self.routes[route] = Counts()
        counts = [self.total, route_counts]
        bucket = self._bucket()
        bucket.requests += 1
        for c in counts:
            c.requests += 1
        saved = 0.0
        if status in HIT_STATUSES:
            tier_name = tier or "unknown"
            counts.append(self.tiers.setdefault(tier_name, Counts()))
            cost = hit_cost if hit_cost is not None else (self._costs.get(key) if key is not None else None)
            if cost is None:
                self.hits_without_cost += 1
            else:
                saved = cost
            for c in counts:
                c.hits += 1
                c.cost_saved_s += saved
            counts[-1].requests += 1
            bucket.hits += 1
            bucket.tier_hits[tier_name] = bucket.tier_hits.get(tier_name, 0) + 1
            if key is not None:
                self.top.add(key, {"route": route, "tier": tier_name, **(label or {})})
        elif status in MISS_STATUSES:
            for c in counts:
                c.misses += 1
            bucket.misses += 1
            if tier == COALESCED:
                self.coalesced += 1
            elif key is not None and upstream_seconds is not None:
                self._remember(key, upstream_seconds)
        elif status is not None:  # None: no cache stage decided (a pass-through route), counted in requests only
            if status == CacheStatus.BYPASS:
                for c in counts:
                    c.bypasses += 1
            elif status == CacheStatus.ERROR:
                for c in counts:
                    c.errors += 1
        return saved

    def forget(self, keys: Iterable[str]) -> None:
        """Entries deleted by an admin: drop them from the top list and the cost memory."""
        for key in keys:
            self.top.discard(key)
            self._costs.pop(key, None)

    def _remember(self, key: str, cost: float) -> None:
        self._costs[key] = cost
        self._costs.move_to_end(key)
        while len(self._costs) > COST_MEMORY:
            self._costs.popitem(last=False)

    def _bucket(self) -> Bucket:
        start = math.floor(self._clock() / self.interval_s) * self.interval_s
        if not self.series or self.series[-1].start != start:
            self.series.append(Bucket(start))
            del self.series[:-self.max_buckets]
        return self.series[-1]

    def snapshot(self, top_n: int = 20) -> dict[str, Any]:
        """Plain data for JSON."""
        return {
            "since": self.started,
            "total": self.total.as_dict(),
            "routes": {name: c.as_dict() for name, c in sorted(self.routes.items())},
            "served_by_tier": {name: c.as_dict() for name, c in sorted(self.tiers.items())},
            "coalesced": self.coalesced,
            "cost_saved_s": round(self.total.cost_saved_s, 6),
            "hits_without_cost": self.hits_without_cost,
            "top_entries": [{"key": c.key, "hits": c.count, "error": c.error, **c.label}
                            for c in self.top.top(top_n)],
            "series": {"interval_s": self.interval_s,
                       "buckets": [{"start": b.start, "requests": b.requests, "hits": b.hits, "misses": b.misses,
                                    "tier_hits": dict(b.tier_hits)} for b in self.series]},
        }


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: ``buckets`` are cumulative ``(upper_bound, count)`` pairs in order,
    the last one ``+Inf``; linear interpolation inside the bucket; ``None`` when there are no observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def latency_percentiles(samples: Iterable[Any], metric: str = "ragproxy_request_duration_seconds",
                        group_by: str = "cache_status",
                        quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, dict[str, float | None]]:
    """Percentiles per ``group_by`` label from the ``_bucket`` samples of a Prometheus histogram family
    (``prometheus_client`` ``Metric.samples``), summed over the other labels."""
    cumulative: dict[str, dict[float, float]] = {}
    for sample in samples:
        if sample.name != metric + "_bucket":
            continue
        group = sample.labels.get(group_by, "")
        bound = float(sample.labels["le"])
        per_group = cumulative.setdefault(group, {})
        per_group[bound] = per_group.get(bound, 0.0) + sample.value
    result: dict[str, dict[str, float | None]] = {}
    for group, by_bound in sorted(cumulative.items()):
        ordered = sorted(by_bound.items())
        values: dict[str, float | None] = {f"p{round(q * 100):d}": histogram_quantile(q, ordered) for q in quantiles}
        values["count"] = ordered[-1][1] if ordered else 0.0
        result[group] = values
    return result
