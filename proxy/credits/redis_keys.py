"""API keys in Redis (see :mod:`proxy.credits.keys`).

Layout, all under the hash tag ``{keys}`` (one Cluster slot, so a create or a revoke — each one Lua script —
is atomic; key counts are small): ``<prefix>:{keys}:records`` — hash key id → JSON record (with its hash);
``<prefix>:{keys}:active`` — hash SHA-256 → JSON record, holding active keys only, so a lookup is one
``HGET``; the change feed: ``<prefix>:{keys}:seq`` — the count of changes, and ``<prefix>:{keys}:changes`` — zset
key id → the position of its last change (one member per key, so it holds no more than the records do).

A Redis that lost its data is not believed (:class:`~proxy.credits.redis_wipe.WipeWatch`): every operation is
refused while the watch knows it, and what an empty Redis would answer wrongly in the moment before the watch
notices reads the sentinel again — a key written (so no 201 names a key the restore will not have), a revocation
that found no key (a 503, not a 404), a lookup that found none (a 503, not a 401), a feed that went back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import orjson

from proxy.core.redis_settings import RedisSettings
from proxy.credits.keys import ApiKey, CreatedKey, KeyChanges, display_of, key_hash, matches, new_key, new_key_id
from proxy.credits.redis_store import RedisClient, connect, reconnecting, unavailable_on_failure
from proxy.credits.redis_wipe import WipeWatch

_REDIS = RedisSettings()  # the defaults, defined once there

_CREATE = """
-- KEYS: records, active ; ARGV: key id, hash, record
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

_REVOKE = """
-- KEYS: records, active, seq, changes ; ARGV: key id, now
local text = redis.call('HGET', KEYS[1], ARGV[1])
if not text then return 0 end
local record = cjson.decode(text)
if record['revoked_at'] ~= cjson.null then return 0 end
record['revoked_at'] = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
redis.call('HDEL', KEYS[2], record['hash'])
redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[3]), ARGV[1])
return 1
"""

_CHANGES = """
-- KEYS: records, seq, changes ; ARGV: since, page ; -> {seq, key id, position, record, ...}
local seq = tonumber(redis.call('GET', KEYS[2]) or '0')
local out = {seq}
local changed = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[2])
for i = 1, #changed, 2 do
  out[#out + 1] = changed[i]
  out[#out + 1] = changed[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[1], changed[i]) or ''
end
return out
"""

CHANGES_PAGE = 500
"""Changes read from the feed at most per call."""


def _record(text: Any) -> ApiKey:
    fields = orjson.loads(text)
    fields.pop("hash", None)
    return ApiKey(**fields)


class RedisKeyStore:
    """API keys shared by every replica through Redis."""

    name = "redis"

    def __init__(
        self, client: RedisClient, *, prefix: str = "ragproxy:credits", clock: Callable[[], float] = time.time,
        reconnect_s: float = _REDIS.reconnect_s,
    ) -> None:
        self.client = client
        self.reconnect_s = reconnect_s
        self.wipe: WipeWatch | None = None
        self.records = f"{prefix}:{{keys}}:records"
        self.active = f"{prefix}:{{keys}}:active"
        self.seq = f"{prefix}:{{keys}}:seq"
        self.changed = f"{prefix}:{{keys}}:changes"
        self.clock = clock
        self._create = client.register_script(_CREATE)
        self._revoke = client.register_script(_REVOKE)
        self._changes = client.register_script(_CHANGES)

    @classmethod
    def from_url(
        cls, url: str, *, cluster: bool = False, timeout_s: float = 2.0, max_connections: int = 64, **options: Any
    ) -> RedisKeyStore:
        """A store on its own client for ``url`` (see :func:`~proxy.credits.redis_store.connect`)."""
        return cls(connect(url, cluster=cluster, timeout_s=timeout_s, max_connections=max_connections), **options)

    async def close(self) -> None:
        await self.client.aclose()

    def _refuse(self) -> None:
        if self.wipe is not None:
            self.wipe.refuse()

    async def _confirm(self) -> None:
        """Refused (:class:`CreditStoreUnavailable`) when the sentinel says Redis lost its data (read now)."""
        if self.wipe is not None:
            await self.wipe.confirm()

    async def create(self, user: str, tenant: str = "default", name: str = "") -> CreatedKey:
        self._refuse()
        plaintext = new_key()
        record = ApiKey(new_key_id(), user, tenant, name, display_of(plaintext), self.clock())
        digest = key_hash(plaintext)
        text = orjson.dumps({**asdict(record), "hash": digest})
        async with unavailable_on_failure("create key"):
            await self._create(keys=[self.records, self.active], args=[record.key_id, digest, text])
            await self._confirm()  # written into a Redis that lost its data: the restore would not have it
        return CreatedKey(record, plaintext)

    async def list(
        self, *, user: str | None = None, tenant: str | None = None, include_revoked: bool = False
    ) -> list[ApiKey]:
        self._refuse()
        async with unavailable_on_failure("list keys"):
            texts = await self.client.hvals(self.records)
        keys = [_record(text) for text in texts]
        keys.sort(key=lambda key: (key.created_at, key.key_id))
        return [key for key in keys if matches(key, user, tenant, include_revoked)]

    async def revoke(self, key_id: str) -> bool:
        self._refuse()
        async with unavailable_on_failure("revoke key"):
            revoked = int(await self._revoke(keys=[self.records, self.active, self.seq, self.changed],
                                             args=[key_id, self.clock()])) == 1
            await self._confirm()  # no such key in an empty Redis is not "no such key"
        return revoked

    @reconnecting
    async def lookup(self, presented: str) -> ApiKey | None:
        async with unavailable_on_failure("look up key"):
            text = await self.client.hget(self.active, key_hash(presented))
            if text is None:
                await self._confirm()  # unknown to an empty Redis is not unknown
        return None if text is None else _record(text)

    @reconnecting
    async def changes(self, since: int | None) -> KeyChanges:
        async with unavailable_on_failure("read key changes"):
            found = await self._changes(keys=[self.records, self.seq, self.changed],
                                        args=[-1 if since is None else since, 0 if since is None else CHANGES_PAGE])
            seq = int(found[0])
            if since is not None and seq < since:
                await self._confirm()  # the feed went back: its data went
        keys = [(str(orjson.loads(text)["hash"]), _record(text))
                for text in found[3::3] if text]
        if len(found) - 1 == 3 * CHANGES_PAGE:  # a full page: more after its last change
            seq = int(float(found[-2]))
        return KeyChanges(seq, keys)
