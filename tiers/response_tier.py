"""A cache tier of responses: a named byte store holding :class:`~tiers.entry.CachedResponse` entries.

The tier turns store failures into misses (caches fail open): an exception or a call slower than ``op_timeout`` is
counted, logged at most once per ``log_interval`` seconds, and the request goes upstream. A
:class:`~tiers.breaker.CircuitBreaker` stops calling a store that keeps failing and probes it until it answers
again, so a dead Redis or disk costs nothing per request. A stored entry that does not decode is a miss, is deleted
and counted as corrupt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from tiers.breaker import CircuitBreaker
from tiers.entry import CachedResponse, CorruptEntry
from tiers.latency import LatencyHistogram
from tiers.storage import KeyValueStore, StoreStats

log = logging.getLogger("ragproxy.tiers")
T = TypeVar("T")


class TierUnavailable(Exception):
    """The tier's breaker is open: the store is not called."""


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    rejected: int = 0
    errors: int = 0
    corrupt: int = 0
    skipped: int = 0
    lookup_seconds: LatencyHistogram = field(default_factory=LatencyHistogram)
    """How long each ``get`` took, whatever its outcome."""

    def lookups(self) -> dict[str, int]:
        """Lookups per result (errors and skipped calls count every operation, not only lookups)."""
        return {"hit": self.hits, "miss": self.misses, "error": self.errors, "skipped": self.skipped,
                "corrupt": self.corrupt}


class ResponseTier:
    """One tier (``l1``, ``l3``...) over any :class:`KeyValueStore`."""

    def __init__(self, name: str, store: KeyValueStore, *, log_interval: float = 30.0,
                 op_timeout: float | None = None, breaker: CircuitBreaker | None = None) -> None:
        self.name = name
        self.store = store
        self.counters = TierCounters()
        self.op_timeout = op_timeout
        self.breaker = breaker or CircuitBreaker()
        self._log_interval = log_interval
        self._last_logged: float | None = None

    async def _call(self, operation: Awaitable[T]) -> T:
        """Run one store operation under the breaker and the timeout."""
        if not self.breaker.allow():
            self.counters.skipped += 1
            if asyncio.iscoroutine(operation):
                operation.close()
            raise TierUnavailable(self.name)
        try:
            result = await (operation if self.op_timeout is None else asyncio.wait_for(operation, self.op_timeout))
        except Exception:
            self.breaker.failure()
            raise
        except BaseException:  # cancelled (the client hung up): no verdict on the store
            self.breaker.release()
            raise
        self.breaker.success()
        return result

    def _failed(self, action: str, exc: Exception) -> None:
        self.counters.errors += 1
        now = time.monotonic()
        if self._last_logged is None or now - self._last_logged >= self._log_interval:
            self._last_logged = now
            log.warning("tier %s: %s failed (%s: %s); serving without it", self.name, action,
                        exc.__class__.__name__, exc)

    async def get(self, key: str) -> CachedResponse | None:
        started = time.perf_counter()
        try:
            raw = await self._call(self.store.get(key))
        except TierUnavailable:
            return None
        except Exception as exc:  # fail open: any backend failure is a miss
            self._failed("get", exc)
            return None
        finally:
            self.counters.lookup_seconds.observe(time.perf_counter() - started)
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
            stored = await self._call(self.store.put(key, entry.encode(), ttl=ttl, tags=tags, cost=entry.cost))
        except TierUnavailable:
            return False
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
            return await self._call(self.store.delete(key))
        except TierUnavailable:
            return False
        except Exception as exc:
            self._failed("delete", exc)
            return False

    async def delete_tag(self, tag: str) -> int:
        return await self.store.delete_tag(tag)

    async def stats(self) -> StoreStats:
        try:
            return await self._call(self.store.stats())
        except TierUnavailable:
            return StoreStats(entries=0, bytes=0)
        except Exception as exc:
            self._failed("stats", exc)
            return StoreStats(entries=0, bytes=0)
