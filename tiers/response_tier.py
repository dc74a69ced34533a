"""A cache tier of responses: a named byte store holding :class:`~tiers.entry.CachedResponse` entries.

The tier turns store failures into misses (caches fail open): an exception from the backend is counted, logged at
most once per ``log_interval`` seconds, and the request goes upstream. A stored entry that does not decode is a miss,
is deleted and counted as corrupt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from tiers.entry import CachedResponse, CorruptEntry
from tiers.storage import KeyValueStore, StoreStats

log = logging.getLogger("ragproxy.tiers")


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    rejected: int = 0
    errors: int = 0
    corrupt: int = 0


class ResponseTier:
    """One tier (``l1``, ``l3``...) over any :class:`KeyValueStore`."""

    def __init__(self, name: str, store: KeyValueStore, *, log_interval: float = 30.0) -> None:
        self.name = name
        self.store = store
        self.counters = TierCounters()
        self._log_interval = log_interval
        self._last_logged = 0.0

    def _failed(self, action: str, exc: Exception) -> None:
        self.counters.errors += 1
        now = time.monotonic()
        if now - self._last_logged >= self._log_interval:
            self._last_logged = now
            log.warning("tier %s: %s failed (%s: %s); serving without it", self.name, action,
                        exc.__class__.__name__, exc)

    async def get(self, key: str) -> CachedResponse | None:
        try:
            raw = await self.store.get(key)
        except Exception as exc:  # fail open: any backend failure is a miss
            self._failed("get", exc)
            return None
        if raw is None:
            self.counters.misses += 1
            return None
        try:
            entry = CachedResponse.decode(raw)
        except CorruptEntry:
            self.counters.corrupt += 1
            await self.delete(key)
            return None
        self.counters.hits += 1
        return entry

    async def put(self, key: str, entry: CachedResponse, *, ttl: float | None, tags: Iterable[str]) -> bool:
        try:
            stored = await self.store.put(key, entry.encode(), ttl=ttl, tags=tags, cost=entry.cost)
        except Exception as exc:
            self._failed("put", exc)
            return False
        if stored:
            self.counters.stores += 1
        else:
            self.counters.rejected += 1
        return stored

    async def delete(self, key: str) -> bool:
        try:
            return await self.store.delete(key)
        except Exception as exc:
            self._failed("delete", exc)
            return False

    async def delete_tag(self, tag: str) -> int:
        return await self.store.delete_tag(tag)

    async def stats(self) -> StoreStats:
        try:
            return await self.store.stats()
        except Exception as exc:
            self._failed("stats", exc)
            return StoreStats(entries=0, bytes=0)
