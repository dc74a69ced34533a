"""What the per-item exact caches share (embeddings inputs, :mod:`proxy.items.embeddings`; reranker pairs,
:mod:`proxy.items.rerank`): a tier, the request's key scope and variant, the bypass rule, keying and looking up
many items — in slices between which the event loop serves other requests (:mod:`proxy.core.pacing`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from normalizer.bypass import BypassSettings
from normalizer.cache_control import CachePolicy
from normalizer.canonical import KeyScope, RequestKind, cache_keys, keyed_request
from normalizer.canonical_json import JSONValue
from normalizer.steps import Steps
from proxy.answers.cache_policy import Canonicalize
from proxy.answers.replies import bypass_header
from proxy.core.context import Reply, RequestContext
from proxy.core.outcome import CacheStatus, Outcome
from proxy.core.pacing import Pacer, finish
from proxy.core.pipeline import Next
from tiers.entry import CachedResponse
from tiers.response_tier import ResponseTier


class ItemsCache:
    """Base of a stage that caches a request item by item, each under its own exact key."""

    needs = frozenset({"cache_policy"})

    def __init__(self, tier: ResponseTier, scope: Canonicalize) -> None:
        """``scope``: the canonicalize stage of the endpoint served (its row, its key scope, its bypass settings)."""
        self.tier = tier
        self.scope = scope
        self.endpoint = scope.endpoint

    @property
    def bypass(self) -> BypassSettings:
        """The bypass rule of the request's scope (configured there: :mod:`proxy.assembly.live_settings`)."""
        return self.scope.bypass

    async def keys(self, ctx: RequestContext, items: Iterable[JSONValue]) -> list[str]:
        """The exact key of each canonical item of the endpoint's kind, in the request's scope and variant (also set
        on the context);
        :class:`~normalizer.canonical_json.CanonicalizationError` when an item cannot be keyed."""
        variant = self.scope.variant(ctx)
        return await finish(_keys(self.endpoint.kind, (keyed_request(item, variant=variant) for item in items),
                                  self.scope.scope(ctx)))

    @staticmethod
    async def bypassed(ctx: RequestContext, reason: str | None, call_next: Next) -> Reply:
        """Forward the request uncached, its answer marked ``X-Cache-Status: BYPASS`` (with the reason when there is
        one)."""
        ctx.outcome, ctx.bypass_reason = Outcome(CacheStatus.BYPASS), reason
        reply = await call_next(ctx)
        if reason is not None:
            reply.headers["X-Cache-Bypass-Reason"] = bypass_header(reason)
        return reply

    async def lookup(self, keys: Sequence[str], policy: CachePolicy) -> list[CachedResponse | None]:
        """The stored entry of each key (``None`` where there is none, or the request may not read)."""
        if not policy.may_read:
            return [None] * len(keys)
        pacer, found = Pacer(), []
        for key in keys:
            found.append(await self.tier.get(key))
            await pacer.turn()
        return found


def _keys(kind: RequestKind, keyed: Iterator[JSONValue], scope: KeyScope) -> Steps[list[str]]:
    """The keys of ``keyed`` canonical items, a few at a time (the scope's prefix is encoded once per batch)."""
    keys: list[str] = []
    while batch := list(islice(keyed, 16)):
        yield
        keys += cache_keys(kind, batch, scope)
    return keys
