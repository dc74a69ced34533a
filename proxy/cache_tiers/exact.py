"""L1: whole answers by exact key in process memory (in shared mode, near copies of the replicas' shared Redis)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.answers.replies import ExactLookup, StillStored
from proxy.cache_tiers.base import Build, answers_report
from proxy.core.cache_tier import CacheTier, Gauge, LookupStats, Off, StageKind, WriteBehind
from proxy.core.endpoints import Endpoint
from proxy.core.pipeline import Stage
from tiers.budgets import MemoryAccount
from tiers.invalidation import Embedding, Invalidator, Removal, Selector
from tiers.memory import MemoryStore
from tiers.near_cache import NearCachedStore
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier


class ExactTier:
    """Answers exact repeats of chat, completion and Responses API requests from its store (promoting them into
    faster tiers)."""

    embedder: Embedding | None = None
    flushable = True

    def __init__(self, answers: ResponseTier, still_stored: StillStored | None = None) -> None:
        self.name = answers.name
        self.answers: ResponseTier | None = answers
        self.write_behind: WriteBehind | None = None
        self.still_stored = still_stored

    def stages(self, kind: StageKind, faster: Sequence[CacheTier]) -> list[Stage]:
        if not isinstance(kind, Endpoint) or self.answers is None:
            return []
        return [ExactLookup(self.answers, promote_into=[t.answers for t in faster if t.answers is not None],
                            still_stored=self.still_stored)]

    async def start(self) -> None:  # shared mode's connections are the runtime's
        pass

    async def stop(self) -> None:
        pass

    async def report(self) -> dict[str, Any]:
        assert self.answers is not None
        return await answers_report(self.answers)

    def lookup_stats(self) -> LookupStats:
        assert self.answers is not None
        counters = self.answers.counters
        return LookupStats(counters.lookups(), counters.lookup_seconds)

    async def invalidate(self, selector: Selector, embedder: Embedding | None, removed: Removal) -> None:
        assert self.answers is not None
        removed.add(await Invalidator([self.answers], embedder=embedder).invalidate(selector))

    async def flush(self, removed: Removal) -> None:
        assert self.answers is not None
        removed.add(await Invalidator([self.answers]).flush())

    def gauges(self) -> Sequence[Gauge]:
        return ()

    def memory(self) -> list[MemoryAccount]:
        """The answers held in process memory (in shared mode, the near copies), by their bytes."""
        store = self.answers.store if self.answers is not None else None
        held = store.near if isinstance(store, NearCachedStore) else store
        if not isinstance(held, MemoryStore):
            return []
        return [MemoryAccount(self.name, held.stats_nowait().bytes, held.policy.capacity, len(held),
                              f"cache.{self.name}.max_bytes")]


def build(b: Build) -> CacheTier | Off:
    cache = b.settings.cache
    if not cache.enabled or not cache.l1.enabled:
        return Off("l1", "cache.enabled is off" if not cache.enabled else "cache.l1.enabled is off")
    if b.shared is not None:
        return ExactTier(b.shared.l1, b.still_stored)
    l1 = cache.l1
    return ExactTier(ResponseTier("l1", MemoryStore(make_policy(l1.policy, l1.max_bytes), max_entries=l1.max_entries)),
                     b.still_stored)
