"""Shared byte store on Redis (standalone or Cluster) behind the ``KeyValueStore`` contract, with its own
admission and eviction by cost and size.

Layout: entries are spread over ``shards`` shards by a CRC32 of their key; every key of shard ``N`` carries the
Cluster hash tag ``{sN}`` (``P:{sN}:...``, ``P`` = the store's ``prefix``), so the Lua scripts of
:mod:`tiers.redis_scripts` (which documents the keys) update an entry, its record, the policy's queue and the
tag index atomically in one call. One shard suits standalone Redis; on a Cluster, shards spread the entries
(and the load) over the masters, each with ``1/shards`` of the budget.

- **Budget** (``max_bytes``, 0 = none): the bytes of stored values (after compression) the store keeps, all
  replicas together. A put is admitted and others evicted by GreedyDual credits (cost per byte, raised by
  reads), the policy of the in-process ``bpcache``'s main cache; a newcomer worth less than what it would push
  out is not stored (``put`` returns ``False``). Redis's ``maxmemory`` stays the outer bound (``volatile-*``
  only touches values, which expire; the bookkeeping keys do not).
- **Compression** (``compress``): values are lz4-compressed with the built-in dictionary of response shapes
  (:mod:`tiers.response_dictionary`) when that makes them smaller; the record says which. The budget counts
  stored bytes, as :meth:`stats` does.
- **Tags**: tags named by ``scanned_tags`` (broad ones every entry carries: ``all``, tenant, namespace, route,
  model, context signature) are kept only in the entry's record and found by scanning the records
  (``HSCAN``, admin operations only); others (documents, collections...) have a per-shard reverse index,
  maintained exactly by the scripts.
- **Tombstones** (``keep_evicted_s``): an entry pushed out before its TTL keeps its record that long, so that
  :meth:`keys_with_tag` with ``include_evicted`` still finds keys whose near copies may live on other replicas;
  :attr:`on_evicted` hears of them and :meth:`release` drops them early once those copies are gone.

``stats``/``clear`` walk every shard (``ZSCAN``/bounded script rounds): O(entries), admin use only. TTLs are
Redis expiries (millisecond precision; a positive TTL below 1 ms rounds up to 1 ms). A URL target gets its
client from :func:`tiers.redis_connect.connect`: Cluster URLs (``redis+cluster://`` / ``rediss+cluster://``, or
``cluster=True``) use ``redis.asyncio.RedisCluster``, which follows ``MOVED``/``ASK`` and failovers;
``redis+sentinel://`` URLs the master the Sentinels name, which follows failovers too.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from tiers import redis_scripts
from tiers.compression import FORMAT_RAW, CorruptBlob
from tiers.redis_connect import KEY_PREFIX, connect
from tiers.redis_scripts import Script
from tiers.response_dictionary import response_compressor
from tiers.storage import StoreStats, check_ttl

SCANNED_TAGS: tuple[str, ...] = ("all", "tenant:", "ns:", "route:", "model:", "sig:")
"""Tags kept out of the reverse index: ``all`` and the prefixes of the broad tags the proxy writes."""

_FLAG_RAW = "0"
_FLAG_LZ4 = "1"
_PROBES = 2
_BATCH = 500
CLIENT_TIMEOUT_S = 5.0
"""Timeout of the client a store builds from a URL, by default (see :func:`tiers.redis_connect.connect`)."""


def _text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply


def _as_bytes(reply: bytes | str) -> bytes:
    """Replies are bytes with ``decode_responses=False`` (required for binary values)."""
    return reply if isinstance(reply, bytes) else reply.encode()


@dataclass(frozen=True, slots=True)
class Record:
    """What a shard knows about an entry besides its value (see :mod:`tiers.redis_scripts`)."""

    size: int
    evicted: bool
    tags: tuple[str, ...]

    @classmethod
    def parse(cls, raw: bytes | str) -> Record:
        header, indexed, other = _text(raw).split("\n", 2)
        fields = header.split(" ")
        return cls(int(fields[0]), fields[4] != "0", (*orjson.loads(indexed), *orjson.loads(other)))


@dataclass(frozen=True, slots=True)
class Read:
    """A value read from Redis and how long it has left (``None``: no expiry)."""

    value: bytes
    ttl_s: float | None


class RedisStore:
    """``KeyValueStore`` on Redis; many proxy replicas sharing one prefix see one cache."""

    name = "redis"

    def __init__(
        self,
        target: str | aioredis.Redis | RedisCluster,
        prefix: str = KEY_PREFIX,
        *,
        cluster: bool | None = None,
        max_connections: int = 64,
        timeout: float = CLIENT_TIMEOUT_S,
        max_bytes: int = 0,
        shards: int = 1,
        compress: bool = False,
        keep_evicted_s: float = 0.0,
        scanned_tags: Sequence[str] = SCANNED_TAGS,
    ) -> None:
        """``target``: a URL or a ``redis.asyncio`` client (standalone or cluster, bytes replies).
        ``prefix``: namespace for every key of this store (no braces). ``cluster``: force cluster mode for a
        URL (default: from the ``+cluster`` scheme; see :mod:`tiers.redis_connect`). ``max_connections``: pool
        size of a client built from a URL (callers beyond it wait up to ``timeout`` seconds for a connection).
        ``max_bytes``: the budget (0: none); ``shards``: how many shards entries and budget are split over;
        ``compress``: lz4 with the built-in dictionary; ``keep_evicted_s``: tombstone lifetime; ``scanned_tags``:
        tags (exact, or prefixes ending in ``:``) kept out of the reverse index.
        """
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain braces (they are Redis Cluster hash tags)")
        if max_bytes < 0 or shards < 1 or keep_evicted_s < 0:
            raise ValueError("max_bytes and keep_evicted_s must be >= 0, shards >= 1")
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.shards = shards
        self.compress = compress
        self.keep_evicted_s = keep_evicted_s
        self.scanned_tags = tuple(scanned_tags)
        self.evictions = 0
        self.bypassed = 0
        self.on_evicted: Callable[[list[str]], None] | None = None
        """Told the keys a put left tombstones for (pushed out before their TTL)."""
        self._compressor = response_compressor()
        self._owns_client = isinstance(target, str)
        self.client: aioredis.Redis | RedisCluster = (
            connect(target, cluster=bool(cluster), timeout_s=timeout, max_connections=max_connections)
            if isinstance(target, str) else target
        )

    # -- layout ----------------------------------------------------------------------------------------------

    def shard(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.shards

    def _base(self, shard: int) -> str:
        return f"{self.prefix}:{{s{shard}}}"

    def value_key(self, key: str) -> str:
        """The Redis key holding ``key``'s value."""
        return f"{self._base(self.shard(key))}:v:{key}"

    def indexed(self, tag: str) -> bool:
        return not any(tag == s or (s.endswith(":") and tag.startswith(s)) for s in self.scanned_tags)

    @property
    def _capacity(self) -> int:
        """Budget of one shard."""
        return 0 if self.max_bytes == 0 else max(1, self.max_bytes // self.shards)

    @property
    def _grace_ms(self) -> int:
        return math.ceil(self.keep_evicted_s * 1000)

    async def _run(self, script: Script, shard: int, *args: Any) -> Any:
        """``EVALSHA`` in ``shard`` (loading the script where Redis does not know it yet)."""
        base = self._base(shard)
        keys = (f"{base}:e",)
        try:
            return await self.client.evalsha(script.sha, 1, *keys, base, *args)
        except NoScriptError:
            await self.client.script_load(script.text)
            return await self.client.evalsha(script.sha, 1, *keys, base, *args)

    # -- values ----------------------------------------------------------------------------------------------

    def _encode(self, value: bytes) -> tuple[bytes, str]:
        if self.compress and value:
            blob = self._compressor.compress(value)
            if blob[0] != FORMAT_RAW:
                return blob, _FLAG_LZ4
        return value, _FLAG_RAW

    def _decode(self, stored: bytes, flags: str) -> bytes:
        return self._compressor.decompress(stored) if flags == _FLAG_LZ4 else stored

    # -- KeyValueStore ---------------------------------------------------------------------------------------

    async def read(self, key: str) -> Read | None:
        """The value and its remaining TTL; a hit raises the entry's credit. A value that does not decode is
        removed and reads as a miss."""
        reply = await self._run(redis_scripts.GET, self.shard(key), key, self._grace_ms)
        if reply is None:
            return None
        stored, pttl, flags = _as_bytes(reply[0]), int(reply[1]), _text(reply[2])
        try:
            value = self._decode(stored, flags)
        except CorruptBlob:
            await self.delete(key)
            return None
        return Read(value, None if pttl < 0 else pttl / 1000)

    async def get(self, key: str) -> bytes | None:
        found = await self.read(key)
        return None if found is None else found.value

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | None = None,
        tags: Iterable[str] = (),
        cost: float = 1.0,
    ) -> bool:
        check_ttl(ttl)
        if not (math.isfinite(cost) and cost >= 0):
            raise ValueError(f"cost must be finite and >= 0, got {cost}")
        ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
        tag_list = sorted(set(tags))
        indexed = [tag for tag in tag_list if self.indexed(tag)]
        other = [tag for tag in tag_list if not self.indexed(tag)]
        stored, flags = self._encode(bytes(value))
        reply = await self._run(redis_scripts.PUT, self.shard(key), key, stored, ttl_ms, repr(float(cost)),
                                self._capacity, flags, self._grace_ms, _PROBES, orjson.dumps(indexed),
                                orjson.dumps(other), *indexed)
        admitted, evicted = int(reply[0]), int(reply[1])
        self.evictions += evicted
        self.bypassed += 1 - admitted
        if len(reply) > 2 and self.on_evicted is not None:
            self.on_evicted([_text(k) for k in reply[2:]])
        return admitted == 1

    async def release(self, keys: Sequence[str]) -> None:
        """Drop the tombstones of ``keys`` now (once no near copy of them can remain)."""
        await asyncio.gather(*(self._run(redis_scripts.RELEASE, shard, *chunk)
                               for shard, members in self._by_shard(keys).items() for chunk in _chunks(members)))

    async def delete(self, key: str) -> bool:
        return int(await self._run(redis_scripts.DELETE, self.shard(key), key)) > 0

    async def _delete_many(self, keys: Iterable[str]) -> int:
        by_shard = self._by_shard(keys)
        counts = await asyncio.gather(*(self._run(redis_scripts.DELETE, shard, *chunk)
                                        for shard, members in by_shard.items()
                                        for chunk in _chunks(members)))
        return sum(int(count) for count in counts)

    def _by_shard(self, keys: Iterable[str]) -> dict[int, list[str]]:
        grouped: dict[int, list[str]] = {}
        for key in keys:
            grouped.setdefault(self.shard(key), []).append(key)
        return grouped

    async def _candidates(self, shard: int, tag: str) -> list[str]:
        """Keys of shard ``shard`` whose record lists ``tag`` (live or not)."""
        base = self._base(shard)
        if self.indexed(tag):
            return [_text(m) for m in await self.client.smembers(f"{base}:t:{tag}")]
        found: list[str] = []
        async for field, raw in self.client.hscan_iter(f"{base}:e", count=_BATCH):
            if tag in Record.parse(raw).tags:
                found.append(_text(field))
        return found

    async def _live(self, shard: int, keys: list[str], include_evicted: bool) -> list[str]:
        replies = await asyncio.gather(*(self._run(redis_scripts.FILTER, shard, "1" if include_evicted else "0",
                                                   *chunk) for chunk in _chunks(keys)))
        return [_text(key) for reply in replies for key in reply]

    async def keys_with_tag(self, tag: str, *, include_evicted: bool = False) -> list[str]:
        """Keys of the live entries carrying ``tag``; with ``include_evicted`` also those pushed out before
        their TTL whose tombstone is still kept (their near copies may still exist)."""

        async def in_shard(shard: int) -> list[str]:
            candidates = await self._candidates(shard, tag)
            return await self._live(shard, candidates, include_evicted) if candidates else []

        found = await asyncio.gather(*(in_shard(shard) for shard in range(self.shards)))
        return [key for keys in found for key in keys]

    async def remove_tag(self, tag: str) -> tuple[int, list[str]]:
        """Remove every entry carrying ``tag`` and its tombstone: how many live entries went, and every key
        removed (tombstones included: near copies of those may still exist)."""
        keys = await self.keys_with_tag(tag, include_evicted=True)
        return (await self._delete_many(keys) if keys else 0), keys

    async def delete_tag(self, tag: str) -> int:
        return (await self.remove_tag(tag))[0]

    async def clear(self) -> int:
        removed = 0
        for shard in range(self.shards):
            left = 1
            while left:
                reply = await self._run(redis_scripts.CLEAR, shard, _BATCH)
                removed, left = removed + int(reply[0]), int(reply[1])
        shard_keys = f"{self.prefix}:{{s".encode()
        stray: list[Any] = []  # keys of another layout under this prefix (e.g. written by an older version)
        async for name in self.client.scan_iter(match=f"{self.prefix}:*", count=_BATCH):
            if not bytes(name).startswith(shard_keys):
                stray.append(name)
        for chunk in _chunks(stray):
            await self.client.unlink(*chunk)
        return removed

    async def stats(self) -> StoreStats:
        entries = total = 0
        for shard in range(self.shards):
            base = self._base(shard)
            batch: list[str] = []
            async for member, _score in self.client.zscan_iter(f"{base}:q", count=_BATCH):
                batch.append(f"{base}:v:{_text(member)}")
            for chunk in _chunks(batch):
                pipe = self.client.pipeline(transaction=False)
                for name in chunk:
                    pipe.exists(name)
                    pipe.strlen(name)
                replies = await pipe.execute()
                live = [int(size) for exists, size in zip(replies[::2], replies[1::2], strict=True) if exists]
                entries, total = entries + len(live), total + sum(live)
        return StoreStats(entries=entries, bytes=total)

    async def close(self) -> None:
        if not self._owns_client:
            return
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()
        else:
            await self.client.aclose(close_connection_pool=True)


def _chunks(items: Sequence[Any], size: int = _BATCH) -> list[Sequence[Any]]:
    return [items[start:start + size] for start in range(0, len(items), size)]
