"""Serving from and storing into the response tiers.

``StoreResponse`` sits outside the lookups: when the answer came from upstream and ended normally, it stores the
complete response (a streamed one assembled first) in the fastest answer tier (L1) and hands a copy to the tiers
that keep one behind it (the cold tier's write-behind queue).
``ExactLookup`` answers an exact-key hit from one tier — as JSON, or replayed as SSE when the client asked for a
stream — and promotes hits from slower tiers into the faster ones.

Response headers: ``X-Cache-Status`` (HIT, SEMANTIC_HIT, MISS, BYPASS, REFRESH), ``X-Cache-Tier`` on hits, ``Age``
(whole seconds since the entry was produced), ``X-Cache-Key`` only when ``cache.expose_key`` is on, and
``X-Cache-Bypass-Reason`` with BYPASS when a rule of :func:`normalizer.bypass.bypass_reason` decided it (printable
ASCII, at most 200 characters: the reason may quote the request's own field names).

A hit keeps the upstream's shape: the body as stored, with the ``Content-Type`` the upstream sent for that form
(``application/json; charset=utf-8``, say), a stream replayed in the upstream's own stream shape
(:class:`proxy.core.sse.StreamShape`) when it was streamed. The entry's endpoint (:mod:`proxy.core.endpoints`) renders
it:
Responses API entries echo the request's own fields outside the key (:func:`normalizer.responses.echo_request`)
and replay as typed events (:mod:`proxy.core.response_events`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from multidict import CIMultiDict

from normalizer.bypass import unstorable_reason
from normalizer.cache_control import CachePolicy
from normalizer.canonical_json import JSONValue
from normalizer.documents import Document
from normalizer.evidence import evidence
from normalizer.responses import continued_response
from proxy.core.cache_tier import WriteBehind
from proxy.core.context import Handoff, Reply, RequestContext
from proxy.core.endpoints import Endpoint, for_entry, for_kind
from proxy.core.outcome import HIT_STATUSES, CacheStatus, Outcome, exact_hit
from proxy.core.pipeline import Named, Next
from proxy.core.reply import Complete
from proxy.core.sse import with_withheld
from proxy.kv.handoffs import SHAPED
from proxy.upstream.forward import DESTINATION
from tiers.embedders.base import FloatArray
from tiers.entry import CachedResponse
from tiers.response_tier import ResponseTier
from tiers.semantic import SemanticScope, answer_text

if TYPE_CHECKING:
    from proxy.answers.settings import CacheSettings

log = logging.getLogger("ragproxy.cache")

StillStored = Callable[[str], Awaitable[bool]]
"""Whether the stored Responses API object of this id is still kept upstream."""
ALL_ENTRIES = "all"  # the tag every entry carries: listing and flushing without knowing keys
JSON = "application/json"
SSE = "text/event-stream"

@dataclass(slots=True)
class SemanticQuery:
    """A question the L2 stage looked up (:data:`SEMANTIC`): where, under which context signature, and its embedding
    once computed (stored entries carry the question, the cold tier the vector)."""

    question: str
    """As compared (the template's lines left out)."""
    where: SemanticScope
    digest: str
    tag: str
    vector: FloatArray | None = None
    asked: str | None = None
    """As asked, when that differs from ``question``."""
    instructions: str = ""
    """What else the request tells the model (system prompt, earlier turns; documents cut out)."""


SEMANTIC: Handoff[SemanticQuery] = Handoff("semantic")
"""The question L2 looked up (given by :class:`~proxy.answers.semantic.SemanticLookup`; read by the store and the
statistics). Declared here, by its reader: the semantic tier imports this module."""
FOLLOWER: Handoff[bool] = Handoff("follower")
"""The request waited on another's identical upstream call: its answer is not stored a second time (given by
:class:`~proxy.answers.coalesce.Coalesce`; read by the store and L2). Declared here, by its reader: coalescing
imports this module."""


def entry_tags(ctx: RequestContext, model: str | None, response_id: str | None = None) -> list[str]:
    """Tags every stored entry carries, so invalidation can find it without its key.

    ``all``; ``tenant:<t>``; ``ns:<t>/<namespace>``; ``route:<chat|completions|embeddings>``; ``model:<m>``;
    ``doc:<id>`` for every document the prompt carried (the document reverse index); ``response:<id>`` for a
    stored Responses API object's own id (``response_id``, kept in the entry's ``meta``) and for the response
    a request continues (``previous_response_id``): a deleted response takes both with it.
    """
    scope = ctx.key_scope
    tenant = scope.tenant if scope is not None else ctx.tenant
    tags = [ALL_ENTRIES, f"tenant:{tenant}", f"ns:{tenant}/{ctx.namespace}", f"route:{ctx.route}"]
    if model:
        tags.append(f"model:{model}")
    tags.extend(f"doc:{doc}" for doc in document_ids(ctx))
    tags.extend(f"response:{rid}" for rid in (response_id, continued_response(ctx.body or {})) if rid is not None)
    semantic = ctx.handoffs.get(SEMANTIC)
    if semantic is not None:  # lets the cold tier's vector search stay inside one context
        tags.append(semantic.tag)
    return tags


def document_ids(ctx: RequestContext) -> list[str]:
    """The ids of the documents the prompt carries (the document reverse index of stored entries)."""
    return [document.id for document in ctx.prompt.documents] if ctx.prompt is not None else []


def sent_documents(ctx: RequestContext) -> tuple[Document, ...]:
    """The prompt's documents in the order the upstream saw them: the routed replica's order when the KV layer
    reordered them, else the client's."""
    documents = ctx.prompt.documents if ctx.prompt is not None else ()
    shape, routed = ctx.handoffs.get(SHAPED), ctx.handoffs.get(DESTINATION)
    if not documents or shape is None or routed is None or routed.replica >= len(shape.orders):
        return documents
    order = [segment.key for segment in shape.orders[routed.replica].order]
    by_id = {document.id: document for document in documents}
    if len(by_id) != len(documents) or sorted(order) != sorted(by_id):
        return documents
    return tuple(by_id[doc_id] for doc_id in order)


def answer_evidence(ctx: RequestContext, answer: str | None, question: str | None) -> JSONValue:
    """What ``answer`` (the text of the answer to ``ctx``'s prompt, :func:`tiers.semantic.answer_text`) to
    ``question`` rests on (:func:`normalizer.evidence.evidence`); ``None`` when the prompt carried no documents."""
    documents = sent_documents(ctx)
    return evidence(answer or "", documents, question or "") if documents else None


def hit_reply(ctx: RequestContext, entry: CachedResponse, outcome: Outcome,
              extra: dict[str, str] | None = None) -> Reply:
    """A reply built from a cached entry, in the form the client asked for, with what the cache did
    (``ctx.outcome``)."""
    ctx.outcome = outcome
    ctx.entry = entry
    headers: CIMultiDict[str] = CIMultiDict()
    headers["Age"] = str(math.floor(entry.age()))
    if extra:
        headers.update(extra)
    answer = for_entry(entry).answer(entry, ctx.body or {}, ctx.stream)
    if isinstance(answer, list):
        return _streamed(headers, entry, answer)
    headers["Content-Type"] = entry.meta.get("json_type") or JSON
    return Reply(status=200, headers=headers, body=answer)


def _streamed(headers: CIMultiDict[str], entry: CachedResponse, events: list[bytes]) -> Reply:
    headers["Content-Type"] = entry.meta.get("sse_type") or SSE
    headers["Cache-Control"] = "no-cache"
    return Reply(status=200, headers=headers, chunks=_iterate(events))


async def _iterate(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def complete_body(reply: Reply, body: bytes, endpoint: Endpoint) -> Complete | None:
    """The answer to store: as received, or assembled from a finished stream; ``None`` if unusable. Built once per
    finished reply and shared by every stage that reads it (:meth:`~proxy.core.reply.Reply.completed`)."""
    return reply.completed(body, endpoint.kind, _assemble)


def _assemble(reply: Reply, body: bytes, kind: str) -> Complete | None:
    endpoint = for_kind(kind)
    content_type = reply.headers.get("Content-Type", "")
    if reply.streamed:
        meta: dict[str, Any] = {"sse_type": content_type} if content_type not in ("", SSE) else {}
        assembled = endpoint.assemble(with_withheld(body, reply.withheld))
        return None if assembled is None else Complete(orjson.dumps(assembled[0]), {**meta, **assembled[1]})
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or ("error" in parsed and parsed["error"] is not None):
        return None
    if not endpoint.finished(parsed):
        return None
    return Complete(body, {"json_type": content_type} if content_type not in ("", JSON) else {})


def bypass_header(reason: str) -> str:
    """A bypass reason as a header value: printable ASCII only, at most 200 characters."""
    return "".join(c if " " <= c <= "~" else "?" for c in reason[:200])


class StoreResponse:
    """On the way back: store complete upstream answers in L1 (and queue them for L3)."""

    name = "store"
    needs = frozenset({"cache_key", "cache_policy"})
    gives = frozenset({"entry", "outcome"})
    reads_if_given: frozenset[Named] = frozenset({"outcome", FOLLOWER, SEMANTIC, SHAPED, DESTINATION})
    live_keys = frozenset({"cache.expose_key"})

    def __init__(self, into: ResponseTier | None, *, endpoint: Endpoint, write_behind: Sequence[WriteBehind] = (),
                 expose_key: bool = False) -> None:
        """``into``: where new answers are stored (``None``: no tier holds answers; only the headers are set);
        ``write_behind``: takers of copies."""
        self.into = into
        self.endpoint = endpoint
        self.write_behind = tuple(write_behind)
        self.expose_key = expose_key

    def configure(self, cache: CacheSettings) -> None:
        self.expose_key = cache.expose_key

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key = ctx.cache_key
        reply = await call_next(ctx)
        policy, outcome = ctx.cache_policy, ctx.outcome
        if key is None or policy is None or (outcome is not None and outcome.status in HIT_STATUSES):
            if key is None and outcome is None:
                ctx.outcome = Outcome(CacheStatus.BYPASS)
            self._headers(ctx, reply, key)
            return reply
        if outcome is None:
            ctx.outcome = Outcome(CacheStatus.REFRESH if policy.force_refresh else CacheStatus.MISS)
        self._headers(ctx, reply, key)
        if self.into is not None and policy.may_store and policy.ttl != 0 and not ctx.handoffs.get(FOLLOWER):
            reply.on_finish(self._store(ctx, key, policy, self.into))
        return reply

    def _headers(self, ctx: RequestContext, reply: Reply, key: str | None) -> None:
        if ctx.bypass_reason is not None and ctx.outcome is not None and ctx.outcome.status == CacheStatus.BYPASS:
            reply.headers["X-Cache-Bypass-Reason"] = bypass_header(ctx.bypass_reason)
        if self.expose_key and key is not None:
            reply.headers["X-Cache-Key"] = key

    def _store(self, ctx: RequestContext, key: str, policy: CachePolicy, into: ResponseTier) -> Any:
        async def store(reply: Reply, ok: bool, body: bytes) -> None:
            if unstorable_reason(reply.status, complete=ok) is not None:
                return
            endpoint = self.endpoint
            stored = complete_body(reply, body, endpoint)
            if stored is None:
                return
            request = ctx.body or {}
            model = request.get("model")
            response_id = endpoint.stored_id(request, stored.body)
            semantic, documents = ctx.handoffs.get(SEMANTIC), document_ids(ctx)
            question = semantic.question if semantic is not None else \
                endpoint.read_question(request, ctx.prompt) if ctx.prompt is not None else None
            rests_on = answer_evidence(ctx, answer_text(stored.body), question) if documents else None
            entry = CachedResponse(
                body=stored.body, kind=endpoint.kind, model=model if isinstance(model, str) else None,
                cost=ctx.upstream_seconds if ctx.upstream_seconds is not None else 1.0,
                meta={"tenant": ctx.tenant, "namespace": ctx.namespace, "route": ctx.route,
                      **({"question": question} if question else {}),
                      **({"asked": semantic.asked} if semantic is not None and semantic.asked
                         and semantic.asked != question else {}),
                      **({"documents": documents} if documents else {}),
                      **({"evidence": rests_on} if rests_on is not None else {}),
                      **({"response_id": response_id} if response_id else {}), **stored.meta},
            )
            tags = entry_tags(ctx, entry.model, response_id)
            await into.put(key, entry, ttl=policy.ttl, tags=tags)
            ctx.entry = entry
            for keep in self.write_behind:
                keep(key, entry, policy.ttl, tags, semantic.vector if semantic is not None else None)

        return store


async def servable(entry: CachedResponse, ctx: RequestContext, policy: CachePolicy,
                   still_stored: StillStored | None) -> bool:
    """Whether a cached entry may answer ``ctx``: young enough for the request, holding what it asks of an answer
    (:meth:`~proxy.core.endpoints.Endpoint.carries`: its usage), and — a stored Responses API object — still kept
    upstream (deleted or expired, whatever copy a race left behind is not served)."""
    if policy.max_age is not None and entry.age() > policy.max_age:
        return False
    if not for_entry(entry).carries(entry, ctx.body or {}, ctx.stream):
        return False
    stored_id = entry.meta.get("response_id")
    return stored_id is None or still_stored is None or await still_stored(stored_id)


class ExactLookup:
    """Answer exact-key hits from one tier; promote them into ``promote_into`` (faster tiers)."""

    needs = frozenset({"cache_key", "cache_policy"})
    gives = frozenset({"entry", "outcome"})

    def __init__(self, tier: ResponseTier, *, promote_into: Sequence[ResponseTier] = (),
                 still_stored: StillStored | None = None) -> None:
        """``still_stored``: whether a stored Responses API object is still kept upstream (an entry of one that is
        not — deleted, expired — is never served)."""
        self.tier = tier
        self.name = tier.name
        self.promote_into = tuple(promote_into)
        self.still_stored = still_stored

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key, policy = ctx.cache_key, ctx.cache_policy
        if key is None or policy is None or not policy.may_read:
            return await call_next(ctx)
        entry = await self.tier.get(key)
        if entry is None or not await servable(entry, ctx, policy, self.still_stored):
            return await call_next(ctx)
        for faster in self.promote_into:
            tags = entry_tags(ctx, entry.model, entry.meta.get("response_id"))
            await faster.put(key, entry, ttl=policy.ttl, tags=tags)
        return hit_reply(ctx, entry, exact_hit(self.tier.name))
