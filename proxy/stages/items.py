"""What the per-item exact caches share (embeddings inputs, :mod:`proxy.stages.embeddings`; reranker pairs,
:mod:`proxy.stages.rerank`): a tier, the request's key scope, the bypass rule, and looking up many keys."""

from __future__ import annotations

from collections.abc import Sequence

from normalizer.bypass import BypassSettings
from normalizer.cache_control import CachePolicy
from proxy.stages.cache_policy import Canonicalize
from tiers.entry import CachedResponse
from tiers.response_tier import ResponseTier


class ItemsCache:
    """Base of a stage that caches a request item by item, each under its own exact key."""

    needs = frozenset({"cache_policy"})

    def __init__(self, tier: ResponseTier, scope: Canonicalize, bypass: BypassSettings) -> None:
        self.tier = tier
        self.scope = scope
        self.bypass = bypass

    async def lookup(self, keys: Sequence[str], policy: CachePolicy) -> list[CachedResponse | None]:
        """The stored entry of each key (``None`` where there is none, or the request may not read)."""
        if not policy.may_read:
            return [None] * len(keys)
        return [await self.tier.get(key) for key in keys]
