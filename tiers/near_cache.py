"""One logical cache across replicas: a bounded in-process near cache in front of a shared :class:`RedisStore`.

Reads: the near copy when this replica's bus is trusted (:attr:`InvalidationBus.trusted`), else Redis, whose
value is copied near for at most ``near_ttl_s`` and never past the entry's remaining Redis TTL (``GET`` and
``PTTL`` in one pipeline; the two keys share a Cluster slot). While the bus is not trusted nothing is served
(neither near nor Redis: the local knowledge versions may be stale too) — every lookup is a miss and goes
upstream, as a failing cache tier does.

Fill race: a Redis reply that was read before another replica deleted the entry may arrive after this replica
applied that deletion. A copy is therefore kept near only when no invalidation was applied while the read (or
the write) was in flight (``bus.generation`` unchanged).

Removals (``delete``, ``delete_tag``, ``clear``) remove from Redis first, then broadcast on the bus and return
only when every replica dropped its copies (see :mod:`tiers.invalidation_bus`); the last
:class:`~tiers.invalidation_bus.Delivery` is kept in :attr:`NearCachedStore.last_delivery`. A tag removal
broadcasts the removed keys, or ``clear`` beyond ``max_broadcast_keys`` (dropping every near copy is always
safe). The near copies carry no tags: tag lookups always ask Redis, the one authority.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tiers.invalidation_bus import Delivery, InvalidationBus
from tiers.memory import MemoryStore
from tiers.redis_store import RedisStore
from tiers.response_tier import ResponseTier
from tiers.storage import StoreStats


class NearCachedStore:
    """``KeyValueStore``: near :class:`MemoryStore` + shared :class:`RedisStore`, kept coherent by the bus."""

    name = "near+redis"

    def __init__(self, near: MemoryStore, shared: RedisStore, bus: InvalidationBus, *, near_ttl_s: float = 30.0,
                 max_broadcast_keys: int = 1000) -> None:
        """``near_ttl_s``: longest a near copy lives (a bound on staleness should a message be lost);
        ``max_broadcast_keys``: above this many removed keys a tag removal broadcasts ``clear`` instead."""
        self.near = near
        self.shared = shared
        self.bus = bus
        self.near_ttl_s = near_ttl_s
        self.max_broadcast_keys = max_broadcast_keys
        self.near_hits = 0
        self.shared_hits = 0
        self.untrusted_misses = 0
        self.last_delivery: Delivery | None = None
        bus.on("keys", self._apply_keys)
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

    # -- KeyValueStore ---------------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        if not self.bus.trusted:
            self.untrusted_misses += 1
            return None
        value = self.near.get_nowait(key)
        if value is not None:
            self.near_hits += 1
            return value
        generation = self.bus.generation
        pipe = self.shared.client.pipeline(transaction=False)
        value_key = self.shared._value_key(key)
        pipe.get(value_key)
        pipe.pttl(value_key)
        raw, pttl = await pipe.execute()
        if raw is None:
            return None
        value = raw if isinstance(raw, bytes) else str(raw).encode()
        self.shared_hits += 1
        ttl = self.near_ttl_s if int(pttl) < 0 else min(self.near_ttl_s, int(pttl) / 1000)
        if ttl > 0 and self.bus.generation == generation and self.bus.trusted:
            self.near.put_nowait(key, value, ttl=ttl)
        return value

    async def put(self, key: str, value: bytes, *, ttl: float | None = None, tags: Iterable[str] = (),
                  cost: float = 1.0) -> bool:
        generation = self.bus.generation
        stored = await self.shared.put(key, value, ttl=ttl, tags=tags, cost=cost)
        if stored and self.bus.generation == generation:
            self.near.put_nowait(key, value, ttl=self.near_ttl_s if ttl is None else min(ttl, self.near_ttl_s),
                                 cost=cost)
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
        return await self.shared.keys_with_tag(tag)

    async def delete_tag(self, tag: str) -> int:
        keys = await self.shared.keys_with_tag(tag)
        removed = await self.shared.delete_tag(tag)
        await self._broadcast_removed(keys)
        return removed

    async def clear(self) -> int:
        removed = await self.shared.clear()
        self.near.clear_nowait()
        self.last_delivery = await self.bus.broadcast("clear")
        return removed

    async def stats(self) -> StoreStats:
        return await self.shared.stats()

    async def close(self) -> None:
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
