"""L3: whole answers by exact key on local disk (lz4, SQLite), written behind the faster tiers; it keeps each
answer's question vector too, so L2 can search it when its own index has lost a question."""

from __future__ import annotations

from typing import Any

from proxy.answers.replies import StillStored
from proxy.cache_tiers.base import Build
from proxy.cache_tiers.exact import ExactTier
from proxy.cache_tiers.shared_mode import SharedMode
from proxy.core.cache_tier import CacheTier, Off
from tiers.cold import ColdStore
from tiers.demotion import Demoter
from tiers.entry import CachedResponse
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier


class ColdTier(ExactTier):
    """Answers exact repeats from disk; takes copies of new answers behind the faster tiers; survives restarts."""

    def __init__(self, store: ColdStore, *, write_queue: int, shared: SharedMode | None = None,
                 warm: MemoryStore | None = None, warmup_entries: int,
                 still_stored: StillStored | None = None) -> None:
        super().__init__(ResponseTier("l3", store, op_timeout=2.0), still_stored)
        self.store = store
        self.demoter = Demoter(store, max_queue=write_queue)
        self.shared = shared
        self.warm = warm
        self.warmup_entries = warmup_entries
        self.write_behind = self._keep

    def _keep(self, key: str, entry: CachedResponse, ttl: float | None, tags: list[str], vector: Any) -> None:
        """Queue a copy of a new answer (never blocks; dropped and counted when the queue is full), with the
        question's embedding when L2 computed one (so this tier can answer semantic lookups)."""
        self.demoter.offer(key, entry.encode(), frozenset(tags), entry.cost, ttl, vector=vector)

    async def start(self) -> None:
        if self.shared is not None:  # removals broadcast by other replicas reach the local disk too
            assert self.answers is not None
            self.shared.follow(self.answers)
        self.demoter.start()
        if self.warm is not None and self.warmup_entries:  # a restarted proxy starts with its hottest answers
            for cold in await self.store.hottest(self.warmup_entries):
                self.warm.put_nowait(cold.key, cold.value, ttl=cold.ttl, tags=cold.tags, cost=cold.cost)

    async def stop(self) -> None:
        await self.demoter.stop()
        await self.store.close()

    async def report(self) -> dict[str, Any]:
        demoter = self.demoter
        return {**await super().report(), "write_behind": {
            "offered": demoter.offered, "written": demoter.demoted, "dropped": demoter.dropped,
            "failed": demoter.failed}}


def build(b: Build) -> CacheTier | Off:
    cache = b.settings.cache
    if not cache.enabled or not cache.l3.enabled:
        return Off("l3", "cache.enabled is off" if not cache.enabled else "cache.l3.enabled is off")
    l3 = cache.l3
    store = ColdStore(b.settings.data_dir / "cold", max_bytes=l3.max_bytes, policy=make_policy(l3.policy, l3.max_bytes))
    warm = next((t.answers.store for t in b.built if t.answers is not None), None)
    return ColdTier(store, write_queue=l3.write_queue, shared=b.shared,
                    warm=warm if isinstance(warm, MemoryStore) and b.shared is None else None,
                    warmup_entries=l3.warmup_entries, still_stored=b.still_stored)
