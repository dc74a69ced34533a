"""The Qdrant side of the pipeline: the vector-search cache on searches, invalidation on writes.

Every stage here runs after :class:`~proxy.search.requests.BuildQdrantRequest` and reads what it built — the
upstream path and the mapped body — never the client's path: a cached search is keyed, and a write invalidates, by
the upstream collection, so two tenants' collections of one name never share or drop each other's searches (the
entries are per tenant as well).

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
from urllib.parse import parse_qsl, unquote

import orjson
from multidict import CIMultiDict

from normalizer.documents import DocumentRegistry, payload_texts
from normalizer.search_request import parse_search
from proxy.core.context import Reply, RequestContext
from proxy.core.outcome import CacheStatus, Matched, Outcome
from proxy.core.pipeline import Next
from tiers.retrieval import RetrievalCache, WriteEffect, WriteScope, write_effects

log = logging.getLogger("ragproxy.retrieval")

CollectionFetcher = Callable[[str], Awaitable[bytes | None]]
"""``GET /collections/{name}`` of the Qdrant upstream (``None`` when it cannot say)."""
INVALIDATE = "X-Cache-Invalidate"

RETRIEVAL = "retrieval"
"""The tier name of answers from the search cache (``X-Cache-Tier``, pricing, statistics)."""


def upstream_target(ctx: RequestContext) -> tuple[str, dict[str, str]]:
    """The decoded path (names hold no ``/``) and the query of the request built for Qdrant."""
    path, _, query = ctx.upstream_path.partition("?")
    return unquote(path), dict(parse_qsl(query))


def asked_invalidation(ctx: RequestContext, path: str) -> WriteEffect | None:
    """The collection-wide invalidation a request asks for with ``X-Cache-Invalidate: collection``, if any (of the
    upstream collection of its upstream ``path``: the qdrant stage checked the tenant may write it)."""
    if (not path.startswith("/collections/") or path == "/collections/aliases"  # (the alias actions name none)
            or ctx.request.headers.get(INVALIDATE, "").strip().lower() != "collection"):
        return None
    name = path.split("/")[2]
    return WriteEffect(WriteScope.COLLECTION, name) if name else None


async def honour_invalidation(cache: RetrievalCache, ctx: RequestContext, path: str) -> None:
    """Apply an ``X-Cache-Invalidate`` header before the request runs."""
    effect = asked_invalidation(ctx, path)
    if effect is not None:
        ctx.response_headers["X-Cache-Invalidated"] = str(await cache.invalidate(effect))


class RetrievalLookup:
    """Answer searches from the vector-search cache; forward only the missing items."""

    name = RETRIEVAL
    needs = frozenset({"upstream_path"})
    gives = frozenset({"outcome"})

    def __init__(self, cache: RetrievalCache, fetch_collection: CollectionFetcher) -> None:
        self.cache = cache
        self.fetch_collection = fetch_collection

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        path, query = upstream_target(ctx)
        await honour_invalidation(self.cache, ctx, path)
        try:
            request = parse_search(path, ctx.outgoing_json() or {}, query)
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
    needs = frozenset({"upstream_path"})
    gives: frozenset[str] = frozenset()

    def __init__(self, cache: RetrievalCache) -> None:
        self.cache = cache

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        path, _ = upstream_target(ctx)
        await honour_invalidation(self.cache, ctx, path)
        body = ctx.outgoing_json()
        try:
            return await call_next(ctx)
        finally:
            for effect in write_effects(ctx.method, path, body):
                await self.cache.invalidate(effect)
