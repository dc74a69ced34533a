"""One logical cache across replicas: a bounded in-process near cache in front of a shared :class:`RedisStore`.

Reads: the near copy when this replica's bus is trusted (:attr:`InvalidationBus.trusted`), else Redis, whose
value is copied near for at most ``near_ttl_s`` and never past the entry's remaining Redis TTL (value and TTL
come back from one script call, :meth:`RedisStore.read`). While the bus is not trusted nothing is served
(neither near nor Redis: the local knowledge versions may be stale too) — every lookup is a miss and goes
upstream, as a failing cache tier does.

Fill race: a Redis reply that was read before another replica deleted the entry may arrive after this replica
applied that deletion. A copy is therefore kept near only when no invalidation was applied while the read (or
the write) was in flight (``bus.generation`` unchanged).

Near copies exist only of entries Redis admitted (a put the shared store's budget declines keeps no copy).
When a put pushes entries out of Redis before their TTL, the writer broadcasts their keys (kind ``evicted``,
batched every ``notify_delay_s``, in the background) so that every replica drops its copies, then releases
their tombstones (below); should that fail, the tombstones simply live out their time. A copy's lifetime is
counted from the start of the read or write that made it, so that it never outlives the tombstone of its entry.

Removals (``delete``, ``delete_tag``, ``clear``) remove from Redis first, then broadcast on the bus and return
only when every replica dropped its copies (see :mod:`tiers.invalidation_bus`); the last
:class:`~tiers.invalidation_bus.Delivery` is kept in :attr:`NearCachedStore.last_delivery`. A tag removal
broadcasts the removed keys, or ``clear`` beyond ``max_broadcast_keys`` (dropping every near copy is always
safe). The near copies carry no tags: tag lookups always ask Redis, the one authority — including for entries
Redis already evicted whose near copies may still live: the shared store keeps their records (tombstones)
for ``keep_evicted_s`` >= ``near_ttl_s``, and :meth:`NearCachedStore.keys_with_tag` lists them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from tiers.background import stop_task
from tiers.invalidation_bus import Delivery, InvalidationBus
from tiers.memory import MemoryStore
from tiers.redis_store import RedisStore
from tiers.response_tier import ResponseTier
from tiers.storage import StoreStats

NEAR_TTL_S = 30.0
"""Longest a near copy lives by default (``redis.near_ttl_s``)."""

log = logging.getLogger("ragproxy.shared")


class NearCachedStore:
    """``KeyValueStore``: near :class:`MemoryStore` + shared :class:`RedisStore`, kept coherent by the bus."""

    name = "near+redis"

    def __init__(self, near: MemoryStore, shared: RedisStore, bus: InvalidationBus, *, near_ttl_s: float = NEAR_TTL_S,
                 max_broadcast_keys: int = 1000, notify_delay_s: float = 0.05) -> None:
        """``near_ttl_s``: longest a near copy lives (a bound on staleness should a message be lost; at most
        ``shared.keep_evicted_s``); ``max_broadcast_keys``: above this many removed keys a tag removal broadcasts
        ``clear`` instead; ``notify_delay_s``: how long evicted keys are collected before one broadcast."""
        if shared.keep_evicted_s < near_ttl_s:
            raise ValueError("shared.keep_evicted_s must be >= near_ttl_s: an invalidation must still find the "
                             "keys of evicted entries while near copies of them may live")
        self.near = near
        self.shared = shared
        self.bus = bus
        self.near_ttl_s = near_ttl_s
        self.max_broadcast_keys = max_broadcast_keys
        self.near_hits = 0
        self.shared_hits = 0
        self.untrusted_misses = 0
        self.last_delivery: Delivery | None = None
        self.notify_delay_s = notify_delay_s
        self._evicted: list[str] = []
        self._notifier: asyncio.Task[None] | None = None
        shared.on_evicted = self._note_evicted
        bus.on("keys", self._apply_keys)
        bus.on("evicted", self._apply_keys)
        bus.on("clear", self._apply_clear)
        bus.on_resync(self._drop_all)

    # -- bus handlers ----------------------------------------------------------------------------------------

    async def _apply_keys(self, message: dict[str, Any]) -> None:
        for key in message.get("keys") or ():
            self.near.delete_nowait(str(key))

    async def _apply_clear(self, _message: dict[str, Any]) -> None:
        self.near.clear_nowait()

    async def _drop_all(self) -> None:
        self.near.clear_nowait()

    # -- evictions -------------------------------------------------------------------------------------------

    def _note_evicted(self, keys: list[str]) -> None:
        self._evicted.extend(keys)
        if self._notifier is None or self._notifier.done():
            self._notifier = asyncio.get_running_loop().create_task(self._notify_evicted(), name="near-evicted")

    async def _notify_evicted(self) -> None:
        """Have every replica drop its copies of the evicted keys, then release their tombstones."""
        while self._evicted:
            await asyncio.sleep(self.notify_delay_s)
            keys, self._evicted = self._evicted, []
            try:
                await self.bus.broadcast("evicted", keys=keys)
                await self.shared.release(keys)
            except Exception as exc:  # the tombstones live out keep_evicted_s instead
                log.debug("near cache: eviction notice failed (%s: %s)", exc.__class__.__name__, exc)

    # -- KeyValueStore ---------------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        if not self.bus.trusted:
            self.untrusted_misses += 1
            return None
        value = self.near.get_nowait(key)
        if value is not None:
            self.near_hits += 1
            return value
        generation, started = self.bus.generation, time.monotonic()
        found = await self.shared.read(key)
        if found is None:
            return None
        self.shared_hits += 1
        ttl = (self.near_ttl_s if found.ttl_s is None else min(self.near_ttl_s, found.ttl_s)) \
            - (time.monotonic() - started)
        if ttl > 0 and self.bus.generation == generation and self.bus.trusted:
            self.near.put_nowait(key, found.value, ttl=ttl)
        return found.value

    async def put(self, key: str, value: bytes, *, ttl: float | None = None, tags: Iterable[str] = (),
                  cost: float = 1.0) -> bool:
        generation, started = self.bus.generation, time.monotonic()
        stored = await self.shared.put(key, value, ttl=ttl, tags=tags, cost=cost)
        near_ttl = (self.near_ttl_s if ttl is None else min(ttl, self.near_ttl_s)) - (time.monotonic() - started)
        if stored and near_ttl > 0 and self.bus.generation == generation:
            self.near.put_nowait(key, value, ttl=near_ttl, cost=cost)
        return stored

    async def delete(self, key: str) -> bool:
        existed = await self.shared.delete(key)
        self.near.delete_nowait(key)
        self.last_delivery = await self.bus.broadcast("keys", keys=[key])
        return existed

    async def delete_keys(self, keys: list[str]) -> Delivery:
        """Remove many keys with one broadcast."""
        for key in keys:
            await self.shared.delete(key)
            self.near.delete_nowait(key)
        self.last_delivery = await self.bus.broadcast("keys", keys=keys)
        return self.last_delivery

    async def keys_with_tag(self, tag: str) -> list[str]:
        """Live entries and those evicted recently enough that near copies may remain (removing them drops
        those copies)."""
        return await self.shared.keys_with_tag(tag, include_evicted=True)

    async def delete_tag(self, tag: str) -> int:
        removed, keys = await self.shared.remove_tag(tag)
        await self._broadcast_removed(keys)
        return removed

    async def clear(self) -> int:
        removed = await self.shared.clear()
        self.near.clear_nowait()
        self.last_delivery = await self.bus.broadcast("clear")
        return removed

    async def stats(self) -> StoreStats:
        return await self.shared.stats()

    async def stop_notices(self) -> None:
        """Stop sending eviction notices (before the bus stops); pending tombstones live out their time."""
        if self._notifier is not None:
            await stop_task(self._notifier)
            self._notifier = None
        self._evicted = []

    async def close(self) -> None:
        await self.stop_notices()
        await self.shared.close()

    async def _broadcast_removed(self, keys: list[str]) -> None:
        if len(keys) > self.max_broadcast_keys:
            self.near.clear_nowait()
            self.last_delivery = await self.bus.broadcast("clear")
            return
        for key in keys:
            self.near.delete_nowait(key)
        self.last_delivery = await self.bus.broadcast("keys", keys=keys)


class SharedResponseTier(ResponseTier):
    """A :class:`ResponseTier` whose removals are admin operations: not cut short by the per-operation timeout
    (they wait for the replicas' acknowledgements) and loud on failure. Reads and writes still fail open."""

    async def delete(self, key: str) -> bool:
        return await self.store.delete(key)

    async def delete_tag(self, tag: str) -> int:
        return await self.store.delete_tag(tag)
