"""Shared byte store on Redis (standalone or Cluster) behind the ``KeyValueStore`` contract.

Key layout (``P`` = the store's ``prefix``, e.g. ``ragproxy:l1``; ``K`` = the entry's key)::

    P:v:{h:K}   string  the value (binary), expiring with the entry (PEXPIRE)
    P:k:{h:K}   set     the entry's tags, same expiry as the value
    P:t:T       set     keys of the entries tagged ``T`` (may hold stale members, see below)

- ``{h:K}`` is a Redis Cluster hash tag: an entry's value and tag list always live in the same slot, so one
  Lua script writes or deletes both atomically. The ``h:`` keeps the tag non-empty for the empty key. Tag sets
  are spread over the cluster by their own names; no operation needs them in one slot with anything else.
- ``put`` is one round trip: a pipeline of the entry script (SET value + replace tag list, with expiry) and,
  per tag, a script that adds the key to ``P:t:T`` and stretches the set's expiry to the longest-lived member
  (persistent while any member is).
- Tag sets are cleaned lazily: ``keys_with_tag`` keeps a member only while ``P:k:{h:K}`` still lists the tag
  (the entry may have expired, been deleted or overwritten with other tags) and removes the others from the
  set.
- ``stats``/``clear`` scan ``P:v:*`` / ``P:*`` (over every primary in a cluster): O(entries), admin use only.
- TTLs are Redis expiries (millisecond precision); a positive TTL below 1 ms rounds up to 1 ms.

Cluster URLs (``redis+cluster://`` / ``rediss+cluster://``, or ``cluster=True``) use
``redis.asyncio.RedisCluster``, which follows ``MOVED``/``ASK`` and failovers; pipelines are split per node by
the client.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from tiers.storage import StoreStats

_PUT = """
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
if #ARGV > 2 then redis.call('SADD', KEYS[2], unpack(ARGV, 3)) end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  if #ARGV > 2 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return 1
"""

_TAG_ADD = """
local existed = redis.call('EXISTS', KEYS[1])
redis.call('SADD', KEYS[1], ARGV[1])
local ttl = tonumber(ARGV[2])
if ttl <= 0 then
  redis.call('PERSIST', KEYS[1])
elseif existed == 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  local current = redis.call('PTTL', KEYS[1])
  if current >= 0 and current < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
end
return 1
"""

_DELETE = """
local tags = redis.call('SMEMBERS', KEYS[2])
local existed = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
table.insert(tags, 1, existed)
return tags
"""

_SCAN_BATCH = 500


def _as_bytes(reply: bytes | str) -> bytes:
    """Replies are bytes with ``decode_responses=False`` (required for binary values)."""
    return reply if isinstance(reply, bytes) else reply.encode()


class RedisStore:
    """``KeyValueStore`` on Redis; many proxy replicas sharing one prefix see one cache."""

    name = "redis"

    def __init__(
        self,
        target: str | aioredis.Redis | RedisCluster,
        prefix: str = "ragproxy",
        *,
        cluster: bool | None = None,
        max_connections: int = 64,
        timeout: float = 5.0,
    ) -> None:
        """``target``: a URL or a ``redis.asyncio`` client (standalone or cluster, bytes replies).
        ``prefix``: namespace for every key of this store (no braces). ``cluster``: force cluster mode for a
        URL (default: from the ``+cluster`` scheme). ``max_connections``: pool size of a client built from a
        URL (callers beyond it wait up to ``timeout`` seconds for a connection).
        """
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain braces (they are Redis Cluster hash tags)")
        self.prefix = prefix
        self._owns_client = isinstance(target, str)
        if isinstance(target, str):
            is_cluster = cluster if cluster is not None else "+cluster://" in target
            url = target.replace("+cluster://", "://")
            if is_cluster:
                self.client: aioredis.Redis | RedisCluster = RedisCluster.from_url(
                    url, max_connections=max_connections, socket_timeout=timeout
                )
            else:
                pool = aioredis.BlockingConnectionPool.from_url(
                    url, max_connections=max_connections, timeout=timeout, socket_timeout=timeout
                )
                self.client = aioredis.Redis(connection_pool=pool)
        else:
            self.client = target

    def _value_key(self, key: str) -> str:
        return f"{self.prefix}:v:{{h:{key}}}"

    def _tags_key(self, key: str) -> str:
        return f"{self.prefix}:k:{{h:{key}}}"

    def _tag_key(self, tag: str) -> str:
        return f"{self.prefix}:t:{tag}"

    async def get(self, key: str) -> bytes | None:
        value = await self.client.get(self._value_key(key))
        return None if value is None else _as_bytes(value)

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | None = None,
        tags: Iterable[str] = (),
        cost: float = 1.0,
    ) -> bool:
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive (None = no expiry)")
        ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
        tag_list = sorted(set(tags))
        pipe = self.client.pipeline(transaction=False)
        pipe.eval(_PUT, 2, self._value_key(key), self._tags_key(key), bytes(value), ttl_ms, *tag_list)
        for tag in tag_list:
            pipe.eval(_TAG_ADD, 1, self._tag_key(tag), key, ttl_ms)
        await pipe.execute()
        return True

    async def delete(self, key: str) -> bool:
        reply: list[Any] = await self.client.eval(_DELETE, 2, self._value_key(key), self._tags_key(key))
        existed, tags = int(reply[0]), [t.decode() for t in reply[1:]]
        if tags:
            pipe = self.client.pipeline(transaction=False)
            for tag in tags:
                pipe.srem(self._tag_key(tag), key)
            await pipe.execute()
        return existed == 1

    async def keys_with_tag(self, tag: str) -> list[str]:
        tag_key = self._tag_key(tag)
        members = [_as_bytes(m).decode() for m in await self.client.smembers(tag_key)]
        if not members:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in members:
            pipe.sismember(self._tags_key(key), tag)
        flags = await pipe.execute()
        live = [key for key, flag in zip(members, flags, strict=True) if flag]
        stale = [key for key, flag in zip(members, flags, strict=True) if not flag]
        if stale:
            await self.client.srem(tag_key, *stale)
        return live

    async def delete_tag(self, tag: str) -> int:
        keys = await self.keys_with_tag(tag)
        if not keys:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.eval(_DELETE, 2, self._value_key(key), self._tags_key(key))
        replies = await pipe.execute()
        other_tags: dict[str, list[str]] = {}
        removed = 0
        for key, reply in zip(keys, replies, strict=True):
            removed += int(reply[0])
            for other in reply[1:]:
                if other.decode() != tag:
                    other_tags.setdefault(other.decode(), []).append(key)
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self._tag_key(tag))
        for other, members in other_tags.items():
            pipe.srem(self._tag_key(other), *members)
        await pipe.execute()
        return removed

    async def clear(self) -> int:
        removed = 0
        batch: list[Any] = []
        async for name in self.client.scan_iter(match=f"{self.prefix}:*", count=_SCAN_BATCH):
            batch.append(name)
            if len(batch) >= _SCAN_BATCH:
                removed += await self._unlink(batch)
                batch = []
        if batch:
            removed += await self._unlink(batch)
        return removed

    async def _unlink(self, names: list[Any]) -> int:
        """Unlink ``names``; how many of them were values (entries)."""
        marker = f"{self.prefix}:v:".encode()
        values = sum(1 for name in names if bytes(name).startswith(marker))
        await self.client.unlink(*names)
        return values

    async def stats(self) -> StoreStats:
        entries = total = 0
        batch: list[Any] = []

        async def measure(names: list[Any]) -> tuple[int, int]:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
                pipe.strlen(name)
            replies = await pipe.execute()
            live = [int(size) for exists, size in zip(replies[::2], replies[1::2], strict=True) if exists]
            return len(live), sum(live)

        async for name in self.client.scan_iter(match=f"{self.prefix}:v:*", count=_SCAN_BATCH):
            batch.append(name)
            if len(batch) >= _SCAN_BATCH:
                count, size = await measure(batch)
                entries, total, batch = entries + count, total + size, []
        if batch:
            count, size = await measure(batch)
            entries, total = entries + count, total + size
        return StoreStats(entries=entries, bytes=total)

    async def close(self) -> None:
        if not self._owns_client:
            return
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()
        else:
            await self.client.aclose(close_connection_pool=True)
