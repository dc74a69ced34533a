"""Accounting for each answered request: metrics, statistics, the cache trace, the request span, the access log.

Each concern is one small function of ``(ctx, status, seconds)``; :func:`observer` composes the ones the
configuration turns on, once, so a request pays only for what is on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from opentelemetry.trace import Tracer

from proxy.answers.replies import SEMANTIC
from proxy.core.context import RequestContext
from proxy.core.outcome import COALESCED, HIT_STATUSES, MICRO, CacheStatus
from proxy.observability.metrics import Metrics
from proxy.observability.settings import LoggingSettings
from proxy.observability.stats import RequestStats
from tiers.policies.trace import TraceRecorder

Observer = Callable[[RequestContext, int, float], None]
access_log = logging.getLogger("ragproxy.access")


class Observed(Protocol):
    """What the observers read from the runtime (:class:`proxy.assembly.runtime.Runtime`)."""

    metrics: Metrics
    stats: RequestStats
    trace: TraceRecorder | None
    tracer: Tracer | None


def record_metrics(metrics: Metrics) -> Observer:
    """Requests, durations, upstream time, reused prompt tokens and credits charged."""
    undecided = CacheStatus.NONE  # read once: see proxy.core.outcome

    def observe(ctx: RequestContext, status: int, seconds: float) -> None:
        outcome = ctx.outcome
        metrics.per_request.answered(ctx.route, status, outcome.status if outcome is not None else undecided, seconds)
        label = ctx.replica or ("qdrant" if "qdrant" in ctx.route else "llm")
        if ctx.upstream_seconds is not None:
            metrics.per_request.upstream(label, ctx.upstream_seconds)
        if ctx.reported_cached_tokens:
            metrics.child(metrics.prefix_tokens, label).inc(ctx.reported_cached_tokens)
        if ctx.charged is not None:
            held = outcome is not None and outcome.tier is not None
            metrics.child(metrics.credits_charged, "hit" if held else "upstream").inc(ctx.charged / MICRO)

    return observe


def record_stats(stats: RequestStats, metrics: Metrics) -> Observer:
    """The admin statistics (hits per tier, cost saved, the most asked entries)."""

    def observe(ctx: RequestContext, status: int, seconds: float) -> None:
        asked: dict[str, str] | None = None
        outcome = ctx.outcome
        cache_status, tier = (outcome.status, outcome.tier) if outcome is not None else (None, None)
        entry = ctx.entry
        if cache_status in HIT_STATUSES:  # the top-entries list says who asked, and what
            semantic = ctx.handoffs.get(SEMANTIC)
            question = semantic.question if semantic is not None else \
                entry.meta.get("question") if entry is not None else None  # an exact hit: the entry's question
            asked = {"tenant": ctx.tenant, "namespace": ctx.namespace,
                     **({"question": question[:200]} if isinstance(question, str) and question else {})}
        saved = stats.record(route=ctx.route, cache_status=cache_status, tier=tier, key=ctx.cache_key,
                             upstream_seconds=ctx.upstream_seconds, hit_cost=entry.cost if entry else None,
                             label=asked)
        if saved:
            metrics.child(metrics.cost_saved, tier or "unknown").inc(saved)
        if tier == COALESCED:
            metrics.child(metrics.events, "coalesce", "coalesced").inc()

    return observe


def record_trace(recorder: TraceRecorder) -> Observer:
    """One trace record per answer served or stored (key, size, cost, time)."""

    def observe(ctx: RequestContext, status: int, seconds: float) -> None:
        if ctx.entry is not None and ctx.cache_key is not None:
            recorder.record(ctx.cache_key, len(ctx.entry.body), ctx.entry.cost, time.time())

    return observe


def end_span(ctx: RequestContext, status: int, seconds: float) -> None:
    """The request's span ends with its status and cache outcome."""
    from proxy.core.tracing import end_request_span

    end_request_span(ctx, status)


def log_access(ctx: RequestContext, status: int, seconds: float) -> None:
    """One structured access-log line."""
    access_log.info("%s %s %d", ctx.method, ctx.route, status, extra={
        "request_id": ctx.request_id, "tenant": ctx.tenant, "route": ctx.route,
        "tier": ctx.outcome.tier if ctx.outcome is not None else None,
        "status": status, "latency_ms": round(seconds * 1000, 3)})


class AccessLog:
    """Whether each answered request is logged (``logging.access_log``, live: :mod:`proxy.assembly.live_settings`)."""

    live_keys = frozenset({"logging.access_log"})

    def __init__(self, on: bool) -> None:
        self.on = on

    def configure(self, logging_settings: LoggingSettings) -> None:
        self.on = logging_settings.access_log


def observer(rt: Observed, access: AccessLog) -> Observer:
    """The runtime's observers, composed (metrics and statistics always; the rest as configured; the access log
    as ``access`` says when the request ends)."""
    parts = [record_metrics(rt.metrics), record_stats(rt.stats, rt.metrics)]
    if rt.trace is not None:
        parts.append(record_trace(rt.trace))
    if rt.tracer is not None:
        parts.append(end_span)

    def observe(ctx: RequestContext, status: int, seconds: float) -> None:
        for part in parts:
            part(ctx, status, seconds)
        if access.on:
            log_access(ctx, status, seconds)

    return observe
