"""OpenTelemetry tracing: a span per request and one per pipeline stage, exported over OTLP when configured.

Off by default, and then it costs nothing: :func:`traced_stage` is not applied at all, so the pipeline is the same
chain of awaits as without tracing. When on, the incoming W3C ``traceparent`` becomes the parent of the request span
and the forwarded ``traceparent`` names the proxy's span, so backend spans join the same trace. Each span lists the
patches made to the body sent upstream by the time it ends in ``ragproxy.body_patches``
(:class:`~proxy.core.context.Patch`); a patch's name says which stage made it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Tracer

from proxy.core.context import Reply, RequestContext
from proxy.core.handoffs import RequestTrace

Next = Callable[[RequestContext], Awaitable[Reply]]


def make_tracer(endpoint: str | None, service_name: str,
                processor: SpanProcessor | None = None) -> Tracer:
    """A tracer exporting to ``endpoint`` (OTLP/HTTP), or to ``processor`` (tests)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if processor is not None:
        provider.add_span_processor(processor)
    elif endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider.get_tracer("ragproxy")


def traced_stage(tracer: Tracer, name: str, call: Next) -> Next:
    """``call`` inside a span named after the stage, with the cache outcome as attributes."""

    async def run(ctx: RequestContext) -> Reply:
        request = ctx.trace
        if request is None:
            parent = extract(dict(ctx.request.headers))
            span = tracer.start_span(f"ragproxy {ctx.route}", context=parent,
                                     attributes={"ragproxy.request_id": ctx.request_id, "ragproxy.route": ctx.route})
            request = ctx.trace = RequestTrace(span, trace.set_span_in_context(span, parent))
        with tracer.start_as_current_span(f"stage {name}", context=request.context) as span:
            reply = await call(ctx)
            _attributes(span, ctx)
            return reply

    return run


def _attributes(span: Any, ctx: RequestContext) -> None:
    span.set_attribute("ragproxy.tenant", ctx.tenant)
    if ctx.patches:  # what was changed in the body sent upstream, and by which stage, in order
        span.set_attribute("ragproxy.body_patches", [patch.name for patch in ctx.patches])
    outcome = ctx.outcome
    if outcome is not None:
        span.set_attribute("ragproxy.cache_status", str(outcome.status))
        if outcome.tier:
            span.set_attribute("ragproxy.cache_tier", outcome.tier)
        if outcome.matched:
            span.set_attribute("ragproxy.cache_matched", str(outcome.matched))


def end_request_span(ctx: RequestContext, status: int) -> None:
    if ctx.trace is not None:
        span = ctx.trace.span
        span.set_attribute("http.status_code", status)
        _attributes(span, ctx)
        span.end()
