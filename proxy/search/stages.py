"""The Qdrant side of the pipeline: the vector-search cache on searches, invalidation on writes.

Searches (``points/search|query|recommend`` and their ``/batch`` forms) are parsed into a canonical request; a
plan answers every item it can from the :class:`~tiers.retrieval.RetrievalCache` (exact repeats, or a query vector
within the collection's tolerance) and forwards only the missing items in one upstream call, then assembles the
answer in request order. Anything the parser cannot judge is forwarded untouched.

``X-Cache-Status``: ``HIT`` when every item was an exact repeat, ``SEMANTIC_HIT`` when at least one was answered
approximately, ``MISS`` otherwise; ``X-Cache-Hits: k/n`` counts cached items of a batch.

Writes (upserts, deletes, payload and collection changes) invalidate the cached searches they could change once the
upstream has answered, whatever the status.

A writer that changes a collection directly in Qdrant (not through the proxy) sends ``X-Cache-Invalidate:
collection`` on its next search or write of that collection through the proxy: every cached search of the
collection is dropped (on every replica) before the request runs, and the response says how many went here
(``X-Cache-Invalidated``). ``POST /admin/invalidate {"collection": ...}`` does the same from the admin API.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from multidict import CIMultiDict

from normalizer.documents import DocumentRegistry, payload_texts
from normalizer.search_request import parse_search
from proxy.core.context import Reply, RequestContext
from proxy.core.outcome import CacheStatus, Matched, Outcome
from proxy.core.pipeline import Next
from tiers.retrieval import RetrievalCache, WriteEffect, WriteScope, write_effect

log = logging.getLogger("ragproxy.retrieval")

CollectionFetcher = Callable[[str], Awaitable[bytes | None]]
"""``GET /collections/{name}`` of the Qdrant upstream (``None`` when it cannot say)."""
INVALIDATE = "X-Cache-Invalidate"

RETRIEVAL = "retrieval"
"""The tier name of answers from the search cache (``X-Cache-Tier``, pricing, statistics)."""


def asked_invalidation(ctx: RequestContext) -> WriteEffect | None:
    """The collection-wide invalidation a request asks for with ``X-Cache-Invalidate: collection``, if any."""
    path = ctx.request.path
    if not path.startswith("/collections/") or ctx.request.headers.get(INVALIDATE, "").strip().lower() != "collection":
        return None
    name = path.split("/")[2]
    return WriteEffect(WriteScope.COLLECTION, name) if name else None


async def honour_invalidation(cache: RetrievalCache, ctx: RequestContext) -> None:
    """Apply an ``X-Cache-Invalidate`` header before the request runs."""
    effect = asked_invalidation(ctx)
    if effect is not None:
        ctx.response_headers["X-Cache-Invalidated"] = str(await cache.invalidate(effect))


class RetrievalLookup:
    """Answer searches from the vector-search cache; forward only the missing items."""

    name = RETRIEVAL
    needs: frozenset[str] = frozenset()
    gives = frozenset({"outcome"})

    def __init__(self, cache: RetrievalCache, fetch_collection: CollectionFetcher) -> None:
        self.cache = cache
        self.fetch_collection = fetch_collection

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        await honour_invalidation(self.cache, ctx)
        try:
            request = parse_search(ctx.request.path, ctx.body or {}, dict(ctx.request.query))
        except Exception:  # the parser never guesses; anything odd is simply not cached
            request = None
        if request is None:
            ctx.outcome = Outcome(CacheStatus.BYPASS)
            return await call_next(ctx)
        if not self.cache.knows(request.collection):
            info = await self.fetch_collection(request.collection)
            if info is not None:
                await self.cache.learn_collection(request.collection, info)
        plan = await self.cache.lookup(ctx.tenant, request)
        hits = len(plan.hits)
        approximate = any(not match.exact for match in plan.hits.values())
        status = CacheStatus.SEMANTIC_HIT if approximate else CacheStatus.HIT
        found = Outcome(status, RETRIEVAL, Matched.NEARBY if approximate else Matched.EXACT)
        if plan.complete:
            ctx.outcome = found
            return self._reply(plan.response(), hits, len(request.items))
        if hits:
            ctx.patch("retrieval.missing", plan.upstream_body)
        reply = await call_next(ctx)
        if reply.status != 200 or reply.body is None:
            return reply
        merged = await self.cache.store(plan, reply.body, cost=ctx.upstream_seconds or 1.0)
        if merged is None:
            return reply
        ctx.outcome = found if hits else Outcome(CacheStatus.MISS)
        return self._reply(merged, hits, len(request.items)).take_over(reply)

    @staticmethod
    def _reply(body: bytes, hits: int, items: int) -> Reply:
        headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json", "X-Cache-Hits": f"{hits}/{items}"})
        return Reply(status=200, headers=headers, body=body)


class RegisterDocuments:
    """Remember the document texts search results carry, so they can be found later inside LLM prompts."""

    name = "documents"
    needs: frozenset[str] = frozenset()
    gives: frozenset[str] = frozenset()

    def __init__(self, registry: DocumentRegistry) -> None:
        self.registry = registry

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        reply = await call_next(ctx)
        if reply.status == 200 and reply.body is not None:
            try:
                answer = orjson.loads(reply.body)
                if isinstance(answer, dict):
                    self.registry.add_many(payload_texts(answer))
            except (orjson.JSONDecodeError, TypeError, ValueError):  # best effort: detection only gets weaker
                log.debug("search results not understood", exc_info=True)
        return reply


class InvalidateSearches:
    """After a Qdrant write has been answered, drop the cached searches it could change."""

    name = "invalidate"
    needs: frozenset[str] = frozenset()
    gives: frozenset[str] = frozenset()

    def __init__(self, cache: RetrievalCache) -> None:
        self.cache = cache

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        await honour_invalidation(self.cache, ctx)
        body: Any = None
        if ctx.raw_body:
            try:
                body = orjson.loads(ctx.raw_body)
            except orjson.JSONDecodeError:
                body = None
        try:
            return await call_next(ctx)
        finally:
            effect = write_effect(ctx.method, ctx.request.path_qs, body)
            if effect is not None:
                await self.cache.invalidate(effect)
