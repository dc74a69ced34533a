"""The terminal stages: send the request to its upstream and hand back the reply.

Which LLM replica to send to is decided by features above this layer, so the keys they give it are declared here
(:class:`~proxy.core.context.Handoff`): :data:`PINNED` (stored responses) and :data:`DESTINATION` (KV routing).
"""

from __future__ import annotations

import time
from typing import Protocol

from proxy.core.context import EndCallback, Handoff, Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.headers import FORWARDED_REQUEST_HEADERS, upstream_request_headers
from proxy.upstream.backends import Backend, BackendPool
from proxy.upstream.client import UpstreamClient, UpstreamError


class Destination(Protocol):
    """The replica routing chose for a request, and the hint headers the upstream request carries."""

    @property
    def replica(self) -> int: ...

    @property
    def headers(self) -> dict[str, str] | None: ...


PINNED: Handoff[int] = Handoff("pinned")
"""The LLM replica (index) that keeps the stored response a request names: forward sends it there only (given by
stored_responses)."""
DESTINATION: Handoff[Destination] = Handoff("destination")
"""The replica routing chose and its hint headers (given by route: a ``proxy.kv.handoffs.RoutedRequest``, which the
store reads too)."""


def _headers_for(ctx: RequestContext, auth: dict[str, str], trust_forwarded: bool, allowed: frozenset[str],
                 body: bytes | None, hints: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """The upstream request's headers: the client's that ``allowed`` names, and the proxy's own
    (:func:`proxy.core.headers.upstream_request_headers`); ``body``: what is sent (its type is JSON: the proxy wrote
    it)."""
    request = ctx.request
    extra = hints
    if ctx.trace is not None:  # tracing on: the upstream's parent is the proxy's forward span
        from opentelemetry.propagate import inject

        carrier: dict[str, str] = {}
        inject(carrier)
        extra = {**(hints or {}), **carrier}
    return upstream_request_headers(
        request.headers,
        client_ip=request.peer,
        scheme=request.scheme,
        request_id=ctx.request_id,
        auth=auth,
        extra=extra,
        trust_forwarded=trust_forwarded,
        allowed=allowed,
        content_type="application/json" if body else None,
    )


# Statuses that say the replica itself is unwell (overloaded, down behind a gateway, timing out). A 500 is kept out:
# one client's malformed request can make a backend answer 500, and that must not open the replica for everyone.
_REPLICA_FAILING = frozenset({502, 503, 504})


class ForwardToLLM:
    """Send to the replica a stored response pins the request to (:data:`PINNED`), else the one routing chose
    (:data:`DESTINATION`, or the first healthy one); retry only a refused connection, and never away from a pinned
    replica."""

    name = "forward"
    gives = frozenset({"upstream_called", "replica", "upstream_seconds"})

    def __init__(self, client: UpstreamClient, pool: BackendPool, *, trust_forwarded: bool = False,
                 forwarded: frozenset[str] = FORWARDED_REQUEST_HEADERS) -> None:
        """``forwarded``: the client headers the upstream gets (:func:`proxy.core.headers.forwarded_headers`)."""
        self.client = client
        self.pool = pool
        self.trust_forwarded = trust_forwarded
        self.forwarded = forwarded

    async def __call__(self, ctx: RequestContext) -> Reply:
        body = ctx.outgoing_body() if ctx.method not in ("GET", "HEAD") else None
        routed, pinned = ctx.handoffs.get(DESTINATION), ctx.handoffs.get(PINNED)
        if pinned is not None:  # a stored response lives on this replica only: no other may answer
            keeper = self.pool.backends[pinned]
            if not keeper.breaker.allow():
                raise ProxyError(503, f"{keeper.described}, which keeps this response, is failing; retrying shortly",
                                 code="upstream_circuit_open", headers={"Retry-After": "2"})
            picked: Backend | None = keeper
        else:
            chosen = self.pool.backends[routed.replica] if routed is not None else None
            # routing's choice stands unless that replica is down or its breaker is open
            usable = chosen is not None and chosen.healthy and chosen.breaker.allow()
            picked = chosen if usable else self.pool.first_healthy()
        if picked is None:
            raise ProxyError(503, "every LLM backend is failing; retrying shortly", code="upstream_circuit_open",
                             headers={"Retry-After": "2"})
        backend: Backend = picked  # its breaker let this call through: it hears how the call ended, whatever happens
        tried: set[int] = set()
        started = time.perf_counter()
        hints = routed.headers if routed is not None else None
        while True:
            backend.in_flight += 1
            ctx.upstream_called = True
            try:
                headers = _headers_for(ctx, backend.auth_headers(), self.trust_forwarded, self.forwarded, body, hints)
                reply = await self.client.send(
                    ctx.method, backend.url + ctx.upstream_path, headers, body,
                    label=backend.described,
                )
            except UpstreamError as exc:
                backend.in_flight -= 1
                if not exc.upstream_fault:  # this process failed (out of descriptors): no verdict on the replica
                    backend.breaker.release()
                    raise
                backend.breaker.failure()
                if not exc.retryable:
                    raise
                self.pool.mark_down(backend, exc.message)
                tried.add(backend.index)
                following = self.pool.healthy_after(tried) if pinned is None else None
                if following is None:
                    raise
                backend = following
                continue
            except BaseException:  # cancelled (the client hung up) or broken otherwise: no longer in flight
                backend.in_flight -= 1
                backend.breaker.release()
                raise
            ctx.replica = backend.label
            if reply.status in _REPLICA_FAILING:
                backend.breaker.failure()
            else:
                backend.breaker.success()
            streamed = reply.chunks is not None
            if not streamed:  # complete already: stages on the way back may price what they keep by it
                ctx.upstream_seconds = time.perf_counter() - started
            reply.on_end(_release(ctx, backend, started, streamed))
            return reply


def _release(ctx: RequestContext, backend: Backend, started: float, streamed: bool) -> EndCallback:
    def done(_reply: Reply, ok: bool) -> None:
        backend.in_flight -= 1
        if streamed:  # until its last chunk
            ctx.upstream_seconds = time.perf_counter() - started

    return done


class ForwardToQdrant:
    """Send to the configured Qdrant server."""

    name = "forward"
    gives = frozenset({"upstream_called"})

    def __init__(self, client: UpstreamClient, url: str | None, api_key: str | None, *,
                 trust_forwarded: bool = False, forwarded: frozenset[str] = FORWARDED_REQUEST_HEADERS) -> None:
        self.client = client
        self.url = url
        self.auth = {"api-key": api_key} if api_key else {}
        self.trust_forwarded = trust_forwarded
        self.forwarded = forwarded

    async def __call__(self, ctx: RequestContext) -> Reply:
        if self.url is None:
            raise ProxyError(502, "no Qdrant upstream is configured (upstreams.qdrant.url)", code="no_upstream")
        if not ctx.upstream_path:  # only a row builds a Qdrant request (the qdrant stage): nothing built, nothing sent
            raise ProxyError(404, "Not Found", code="not_found")
        body = ctx.outgoing_body() if ctx.method not in ("GET", "HEAD") else None
        headers = _headers_for(ctx, self.auth, self.trust_forwarded, self.forwarded, body)
        ctx.upstream_called = True
        return await self.client.send(
            ctx.method, self.url + ctx.upstream_path, headers, body, label="Qdrant"
        )
