"""Per-document caching of rerankers (``/v1/rerank``, ``/rerank``, ``/v2/rerank``, ``/v1/score``, ``/score``):
a repeated query over an overlapping candidate set forwards only the documents not scored before.

Each (query, document) pair has its own exact key (:mod:`normalizer.rerank`: the shapes, what the key covers, how
answers are reassembled) in the request's key scope (tenant, namespace, knowledge version, and the user when
private), like the embeddings items cache (:mod:`proxy.items.embeddings`). Missing pairs go upstream in one call
(duplicates once, without ``top_n``); the answer is rebuilt in the upstream's shape over the client's whole list.
The :data:`RERANK` handoff tells the credits stage how many documents were scored upstream and how many came from
the cache, and the tokens the answer reports (the credits stage does not parse the answer again).

Response headers: ``X-Cache-Status`` (HIT when every document was cached, MISS otherwise, BYPASS), ``X-Cache-Hits``
(``cached/total``), ``X-Cache-Tier`` when any was cached. An upstream answer that is not one result per document
sent is a 502 (its indices could not be mapped back to the client's list).

Every loop over the documents runs in slices between which the event loop serves other requests
(:mod:`proxy.core.pacing`): a request of many documents takes longer itself, and delays no one else by more than a
slice per turn. Their number is bounded before this stage by ``limits.rerank_documents`` (:mod:`normalizer.limits`).
What cannot be sliced — parsing the reranker's answer, encoding the reply — grows with the documents too, so a
request of more than ``cache.rerank_max_documents`` (1,000) goes upstream and back as it is, uncached
(:mod:`normalizer.bypass`, rule 4a): neither the proxy nor its credits stage parses its answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from multidict import CIMultiDict

from normalizer.bypass import bypass_reason
from normalizer.cache_control import CachePolicy
from normalizer.canonical_json import CanonicalizationError
from normalizer.rerank import (
    RerankRequest,
    Scored,
    read_answer,
    read_rerank,
    render,
    reported_tokens,
    token_shares,
    upstream_body,
)
from proxy.answers.cache_policy import Canonicalize
from proxy.answers.replies import entry_tags
from proxy.core.context import Handoff, Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.outcome import CacheStatus, Matched, Outcome
from proxy.core.pacing import Pacer, finish
from proxy.core.pipeline import Named, Next
from proxy.items.cache import ItemsCache
from tiers.entry import CachedResponse
from tiers.response_tier import ResponseTier

JSON = "application/json"

@dataclass(frozen=True, slots=True)
class RerankCount:
    """Documents of one reranker request: scored upstream, and answered from the cache (:data:`RERANK`); ``tokens``:
    what the answer's usage reports (the credits stage records it without parsing the answer again)."""

    scored: int
    cached: int
    tokens: int = 0


RERANK: Handoff[RerankCount] = Handoff("rerank")
"""How many of a reranker request's documents the upstream scored and how many came from the cache (read by the
rerankers' credits)."""


class RerankItemsCache(ItemsCache):
    """Serve cached pairs, score the missing ones in one upstream call, store them, answer the whole request."""

    name = "rerank_items"
    gives: frozenset[Named] = frozenset({"user_scope", "key_scope", "key_variant", "bypass_reason", RERANK, "outcome"})

    def __init__(self, tier: ResponseTier, scope: Canonicalize, *, score: bool = False) -> None:
        """``score``: the bodies are vLLM's score API's (``text_1``/``text_2``)."""
        super().__init__(tier, scope)
        self.score = score

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        body = ctx.body or {}
        policy = ctx.cache_policy
        request: RerankRequest | None = None
        reason: str | None = None
        if policy is not None and (policy.may_read or policy.may_store):
            reason = bypass_reason(body, self.bypass, rules=self.endpoint.rules, namespace=ctx.namespace)
            try:
                request = read_rerank(body, self.score) if reason is None else None
                keys = await self.keys(ctx, request.items()) if request is not None else []
            except CanonicalizationError as exc:
                reason, request = f"not canonicalizable: {exc}", None
        if request is None or policy is None:
            return await self.bypassed(ctx, reason, call_next)
        found = await self.lookup(keys, policy)
        cached = [entry for entry in found if entry is not None]
        pacer = Pacer()
        first: dict[str, int] = {}  # each missing key is asked for once, at its first position
        for position, (key, entry) in enumerate(zip(keys, found, strict=True)):
            if entry is None:
                first.setdefault(key, position)
                await pacer.turn()
        missing = list(first)
        # priced if the client hangs up early
        ctx.handoffs[RERANK] = RerankCount(scored=len(missing), cached=len(cached))
        upstream: Reply | None = None
        fresh: dict[str, Scored] = {}
        shaped_by = found[0].meta if found[0] is not None else {}  # the stored envelope and content type
        if missing:
            positions = list(first.values())
            ctx.patch("rerank_items.missing", lambda sent: upstream_body(sent, request, positions))
            upstream = await call_next(ctx)
            if upstream.status != 200 or upstream.body is None:
                return upstream
            fresh, shaped_by = await self._store(ctx, request, first, upstream, policy)
        scored: list[Scored] = []
        for key, entry in zip(keys, found, strict=True):
            scored.append(fresh[key] if entry is None else Scored(orjson.loads(entry.body), float(entry.meta["score"])))
            await pacer.turn()
        answer = await finish(render(request, scored, shaped_by.get("envelope") or {}, forwarded=bool(missing),
                                     cached_tokens=sum(int(e.meta.get("tokens", 0)) for e in cached)), pacer)
        ctx.handoffs[RERANK] = RerankCount(scored=len(missing), cached=len(cached),
                                     tokens=reported_tokens(answer) if isinstance(answer, dict) else 0)
        status = CacheStatus.MISS if missing else CacheStatus.HIT
        ctx.outcome = Outcome(status, self.tier.name, Matched.EXACT) if cached else Outcome(status)
        headers: CIMultiDict[str] = CIMultiDict({
            "Content-Type": shaped_by.get("json_type") or JSON, "X-Cache-Hits": f"{len(cached)}/{len(keys)}"})
        reply = Reply(status=200, headers=headers, body=orjson.dumps(answer))
        return reply.take_over(upstream) if upstream is not None else reply

    async def _store(self, ctx: RequestContext, request: RerankRequest, first: dict[str, int], upstream: Reply,
                     policy: CachePolicy) -> tuple[dict[str, Scored], dict[str, Any]]:
        """The results of the pairs the upstream just scored (``first``: their keys and positions, in the order
        sent), by key, each stored when the request may store, and the meta of a stored entry (envelope, content
        type); a 502 when the answer is not one result per pair sent. Each entry is made, stored and dropped in
        turn: a large request does not keep a second copy of its results alive (the garbage collector walks what
        lives long)."""
        assert upstream.body is not None
        pacer = Pacer()
        try:
            read = await finish(read_answer(request, orjson.loads(upstream.body), len(first)), pacer)
        except orjson.JSONDecodeError:
            read = None
        if read is None:
            await upstream.finish(False, upstream.body)
            raise ProxyError(502, "the reranker's answer does not hold one result per document sent",
                             code="upstream_invalid_answer")
        results, envelope = read
        shares = await finish(token_shares(request, list(first.values()), reported_tokens(envelope)), pacer)
        content_type = upstream.headers.get("Content-Type", JSON)
        shaped: dict[str, Any] = {"envelope": envelope, **({"json_type": content_type} if content_type != JSON else {})}
        model = (ctx.body or {}).get("model")
        model = model if isinstance(model, str) else None
        storing = policy.may_store and policy.ttl != 0
        for position, key in enumerate(first):
            if storing:
                entry = CachedResponse(body=orjson.dumps(results[position].result), kind="rerank", model=model,
                                       cost=(ctx.upstream_seconds or 1.0) / len(first),
                                       meta={"score": results[position].score, "tokens": shares[position], **shaped})
                await self.tier.put(key, entry, ttl=policy.ttl, tags=entry_tags(ctx, model))
                await pacer.turn()
        return dict(zip(first, results, strict=True)), shaped

