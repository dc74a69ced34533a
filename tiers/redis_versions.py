"""Knowledge versions shared by every replica: counters in Redis, a local copy for the hot path.

Layout: one hash ``<prefix>:{versions}`` (one Cluster slot), field = JSON ``[tenant, namespace]`` (no separator
can be ambiguous), value = the counter. ``HINCRBY`` makes a bump atomic across replicas.

``current()`` is synchronous (it runs in ``Canonicalize`` on every request) and reads the local map only. The
map is replaced by Redis's on every (re)subscription of the bus (``resync``) and kept fresh by ``ver`` messages;
a replica applies ``max(local, received)``, so reordered messages cannot move a version back. ``bump()``
increments in Redis, applies locally, broadcasts and returns after every replica acknowledged (or the lease
ran out, see :mod:`tiers.invalidation_bus`): from then on no replica computes keys under the old version.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from tiers.invalidation_bus import Delivery, InvalidationBus
from tiers.redis_connect import KEY_PREFIX
from tiers.versions import KnowledgeVersions


class RedisVersions(KnowledgeVersions):
    """Drop-in for :class:`KnowledgeVersions` in shared mode (``bump`` is a coroutine here; the admin API awaits
    whatever ``bump`` returns)."""

    def __init__(self, client: aioredis.Redis | RedisCluster, bus: InvalidationBus, *,
                 prefix: str = KEY_PREFIX) -> None:
        super().__init__()
        self.client = client
        self.bus = bus
        self.key = f"{prefix}:{{versions}}"
        self.last_delivery: Delivery | None = None
        self._local: dict[tuple[str, str], int] = {}
        bus.on("ver", self._apply)
        bus.on_resync(self.load)

    def current(self, tenant: str, namespace: str) -> str:
        return str(self._local.get((tenant, namespace), 0))

    async def bump(self, tenant: str, namespace: str) -> str:
        value = int(await self.client.hincrby(self.key, orjson.dumps([tenant, namespace]).decode(), 1))
        self._raise((tenant, namespace), value)
        self.last_delivery = await self.bus.broadcast("ver", tenant=tenant, namespace=namespace, version=value)
        return str(value)

    async def load(self) -> None:
        """Replace the local map with Redis's (the authority; the bus is subscribed before this runs, so any
        later bump arrives as a message)."""
        raw: dict[Any, Any] = await self.client.hgetall(self.key)
        loaded: dict[tuple[str, str], int] = {}
        for field, value in raw.items():
            tenant, namespace = orjson.loads(field)
            loaded[(str(tenant), str(namespace))] = int(value)
        self._local = loaded

    async def _apply(self, message: dict[str, Any]) -> None:
        self._raise((str(message["tenant"]), str(message["namespace"])), int(message["version"]))

    def _raise(self, scope: tuple[str, str], value: int) -> None:
        if value > self._local.get(scope, 0):
            self._local[scope] = value
