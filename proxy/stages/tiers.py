"""Serving from and storing into the response tiers.

``StoreResponse`` sits outside the lookups: when the answer came from upstream and ended normally, it stores the
complete response (a streamed one assembled first) in the fastest answer tier (L1) and hands a copy to the tiers
that keep one behind it (the cold tier's write-behind queue).
``ExactLookup`` answers an exact-key hit from one tier — as JSON, or replayed as SSE when the client asked for a
stream — and promotes hits from slower tiers into the faster ones.

Response headers: ``X-Cache-Status`` (HIT, SEMANTIC_HIT, MISS, BYPASS, REFRESH), ``X-Cache-Tier`` on hits, ``Age``
(whole seconds since the entry was produced), ``X-Cache-Key`` only when ``cache.expose_key`` is on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import orjson
from multidict import CIMultiDict

from normalizer.bypass import unstorable_reason
from normalizer.cache_control import CachePolicy
from normalizer.signature import final_question
from proxy.context import Reply, RequestContext
from proxy.pipeline import Next
from proxy.sse import assemble, replay
from tiers.entry import CachedResponse
from tiers.response_tier import ResponseTier

log = logging.getLogger("ragproxy.cache")

WriteBehind = Callable[[str, CachedResponse, "float | None", list[str], Any], None]
"""Takes a copy of a new answer (key, entry, TTL, tags, the question's embedding or ``None``) without waiting."""
ALL_ENTRIES = "all"  # the tag every entry carries: listing and flushing without knowing keys
JSON = "application/json"
SSE = "text/event-stream"


def entry_tags(ctx: RequestContext, model: str | None) -> list[str]:
    """Tags every stored entry carries, so invalidation can find it without its key.

    ``all``; ``tenant:<t>``; ``ns:<t>/<namespace>``; ``route:<chat|completions|embeddings>``; ``model:<m>``;
    ``doc:<id>`` for every document the prompt carried (the document reverse index).
    """
    scope = ctx.key_scope
    tenant = scope.tenant if scope is not None else ctx.tenant
    tags = [ALL_ENTRIES, f"tenant:{tenant}", f"ns:{tenant}/{ctx.namespace}", f"route:{ctx.route}"]
    if model:
        tags.append(f"model:{model}")
    tags.extend(f"doc:{doc}" for doc in document_ids(ctx))
    if ctx.semantic is not None:  # lets the cold tier's vector search stay inside one context
        tags.append(ctx.semantic.tag)
    return tags


def document_ids(ctx: RequestContext) -> list[str]:
    """The ids of the documents the prompt carries (the document reverse index of stored entries)."""
    return [document.id for document in ctx.prompt.documents] if ctx.prompt is not None else []


def hit_reply(ctx: RequestContext, entry: CachedResponse, *, status: str, tier: str,
              extra: dict[str, str] | None = None) -> Reply:
    """A reply built from a cached entry, in the form the client asked for."""
    ctx.cache_status, ctx.cache_tier = status, tier
    ctx.entry = entry
    headers: CIMultiDict[str] = CIMultiDict()
    headers["X-Cache-Status"] = status
    headers["X-Cache-Tier"] = tier
    headers["Age"] = str(math.floor(entry.age()))
    if extra:
        headers.update(extra)
    if ctx.stream and entry.kind in ("chat", "completion"):
        headers["Content-Type"] = SSE
        headers["Cache-Control"] = "no-cache"
        include_usage = bool(((ctx.body or {}).get("stream_options") or {}).get("include_usage"))
        events = replay(orjson.loads(entry.body), include_usage=include_usage)
        return Reply(status=200, headers=headers, chunks=_iterate(events))
    headers["Content-Type"] = JSON
    return Reply(status=200, headers=headers, body=entry.body)


async def _iterate(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def complete_body(reply: Reply, body: bytes) -> bytes | None:
    """The JSON body to store: as received, or assembled from a finished stream; ``None`` if unusable."""
    if reply.streamed:
        assembled = assemble(body)
        return None if assembled is None else orjson.dumps(assembled)
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return None if not isinstance(parsed, dict) or "error" in parsed else body


class StoreResponse:
    """On the way back: store complete upstream answers in L1 (and queue them for L3)."""

    name = "store"
    needs = frozenset({"cache_key", "cache_policy"})
    gives = frozenset({"entry"})

    def __init__(self, into: ResponseTier | None, *, kind: str, write_behind: Sequence[WriteBehind] = (),
                 expose_key: bool = False) -> None:
        """``into``: where new answers are stored (``None``: no tier holds answers; only the headers are set);
        ``write_behind``: takers of copies."""
        self.into = into
        self.kind = kind
        self.write_behind = tuple(write_behind)
        self.expose_key = expose_key

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key = ctx.cache_key
        reply = await call_next(ctx)
        policy = ctx.cache_policy
        if key is None or policy is None or ctx.cache_status in ("HIT", "SEMANTIC_HIT"):
            if key is None and ctx.cache_status is None:
                ctx.cache_status = "BYPASS"
            self._headers(ctx, reply, key)
            return reply
        if ctx.cache_status is None:
            ctx.cache_status = "REFRESH" if policy.force_refresh else "MISS"
        self._headers(ctx, reply, key)
        if self.into is not None and policy.may_store and policy.ttl != 0 and not ctx.follower:
            reply.on_finish(self._store(ctx, key, policy, self.into))
        return reply

    def _headers(self, ctx: RequestContext, reply: Reply, key: str | None) -> None:
        reply.headers["X-Cache-Status"] = ctx.cache_status or "BYPASS"
        if self.expose_key and key is not None:
            reply.headers["X-Cache-Key"] = key

    def _store(self, ctx: RequestContext, key: str, policy: CachePolicy, into: ResponseTier) -> Any:
        async def store(reply: Reply, ok: bool, body: bytes) -> None:
            if unstorable_reason(reply.status, complete=ok) is not None:
                return
            stored_body = complete_body(reply, body)
            if stored_body is None:
                return
            request = ctx.body or {}
            model = request.get("model")
            semantic, documents = ctx.semantic, document_ids(ctx)
            question = semantic.question if semantic is not None else \
                final_question(request, ctx.prompt) if ctx.prompt is not None else None
            entry = CachedResponse(
                body=stored_body, kind=self.kind, model=model if isinstance(model, str) else None,
                cost=ctx.upstream_seconds if ctx.upstream_seconds is not None else 1.0,
                meta={"tenant": ctx.tenant, "namespace": ctx.namespace, "route": ctx.route,
                      **({"question": question} if question else {}),
                      **({"documents": documents} if documents else {})},
            )
            tags = entry_tags(ctx, entry.model)
            await into.put(key, entry, ttl=policy.ttl, tags=tags)
            ctx.entry = entry
            for keep in self.write_behind:
                keep(key, entry, policy.ttl, tags, semantic.vector if semantic is not None else None)

        return store


class ExactLookup:
    """Answer exact-key hits from one tier; promote them into ``promote_into`` (faster tiers)."""

    needs = frozenset({"cache_key", "cache_policy"})
    gives = frozenset({"entry"})

    def __init__(self, tier: ResponseTier, *, promote_into: Sequence[ResponseTier] = ()) -> None:
        self.tier = tier
        self.name = tier.name
        self.promote_into = tuple(promote_into)

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key, policy = ctx.cache_key, ctx.cache_policy
        if key is None or policy is None or not policy.may_read:
            return await call_next(ctx)
        entry = await self.tier.get(key)
        if entry is None or (policy.max_age is not None and entry.age() > policy.max_age):
            return await call_next(ctx)
        for faster in self.promote_into:
            await faster.put(key, entry, ttl=policy.ttl, tags=entry_tags(ctx, entry.model))
        return hit_reply(ctx, entry, status="HIT", tier=self.tier.name)
