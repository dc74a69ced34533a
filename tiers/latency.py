"""Latency histograms as plain numbers: an observation is a bisection and two additions (no lock, no label lookup),
turned into Prometheus buckets only when scraped (``proxy.observability.metrics``)."""

from __future__ import annotations

import math
from bisect import bisect_left

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
"""Upper bounds in seconds (the last bucket, +Inf, is implied)."""


class LatencyHistogram:
    """Counts per bucket of :data:`LATENCY_BUCKETS` and the sum of what was observed."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` per bucket, +Inf last."""
        running, out = 0, []
        for bound, count in zip((*LATENCY_BUCKETS, math.inf), list(self.counts), strict=True):
            running += count
            out.append((bound, running))
        return out
