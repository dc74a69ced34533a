"""The search cache: Qdrant searches whose query vector is within a tolerance of a cached one reuse its results;
writes through the proxy drop the searches they could change (on every replica in shared mode). The tier the
registry (:mod:`proxy.cache_tiers`) runs, over :class:`tiers.retrieval.RetrievalCache`; its stages are
:mod:`proxy.search.stages`, its settings :mod:`proxy.search.settings`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.core.cache_tier import CacheTier, Gauge, LookupStats, Off, StageKind, WriteBehind
from proxy.core.pipeline import Stage
from proxy.search.settings import RetrievalSettings
from proxy.search.stages import CollectionFetcher, InvalidateSearches, RetrievalLookup
from tiers.budgets import MemoryAccount
from tiers.invalidation import Embedding, Invalidator, Removal, Selector
from tiers.invalidation_bus import InvalidationBus
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier
from tiers.retrieval import RetrievalCache
from tiers.retrieval.shared import share_invalidations
from tiers.retrieval.writes import WriteEffect, WriteScope


class SearchTier:
    """Answers Qdrant searches (every item of a batch it can) from cached results."""

    name = "retrieval"
    answers: ResponseTier | None = None
    write_behind: WriteBehind | None = None
    embedder: Embedding | None = None
    flushable = True

    def __init__(self, cache: RetrievalCache, fetch_collection: CollectionFetcher) -> None:
        self.cache = cache
        self.fetch_collection = fetch_collection

    def stages(self, kind: StageKind, faster: Sequence[CacheTier]) -> list[Stage]:
        if kind == "search":
            return [RetrievalLookup(self.cache, self.fetch_collection)]
        if kind == "write":
            return [InvalidateSearches(self.cache)]
        return []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def report(self) -> dict[str, Any]:
        size = await self.cache.results.stats()
        return {"entries": size.entries, "bytes": size.bytes}

    def lookup_stats(self) -> LookupStats:
        return LookupStats(dict(self.cache.counts), self.cache.lookup_seconds)

    async def invalidate(self, selector: Selector, embedder: Embedding | None, removed: Removal) -> None:
        """A collection, or documents that are Qdrant point ids, drop the cached searches that read them."""
        searches = Invalidator([], retrieval=self.cache, collections=self.cache.collections, embedder=embedder)
        removed.add(await searches.invalidate(selector))

    async def flush(self, removed: Removal) -> None:
        removed.removed[self.name] = await self.cache.invalidate(WriteEffect(WriteScope.ALL))

    def gauges(self) -> Sequence[Gauge]:
        return ()

    def memory(self) -> list[MemoryAccount]:
        return self.cache.memory()


def build(settings: RetrievalSettings, *, cache_enabled: bool, bus: InvalidationBus | None,
          fetch_collection: CollectionFetcher) -> SearchTier | Off:
    """The search cache of ``settings`` (``cache_enabled``: the master switch of every tier; ``bus``: shared mode's
    invalidation bus, when on), or why it is off."""
    if not cache_enabled or not settings.enabled:
        return Off("retrieval", "cache.enabled is off" if not cache_enabled else "cache.retrieval.enabled is off")
    results = RetrievalCache(policy=make_policy(settings.policy, settings.max_bytes),
                             capacity_bytes=settings.max_bytes, default_tolerance=settings.tolerance,
                             ttl=settings.ttl_s)
    for collection, tolerance in settings.collection_tolerances.items():
        results.set_tolerance(collection, tolerance)
    if bus is not None:  # each replica caches its own searches: invalidations reach them all
        share_invalidations(results, bus)
    return SearchTier(results, fetch_collection)
