"""API keys in Redis (see :mod:`proxy.credits.keys`).

Layout, all under the hash tag ``{keys}`` (one Cluster slot, so a create or a revoke — each one Lua script —
is atomic; key counts are small): ``<prefix>:{keys}:records`` — hash key id → JSON record (with its hash);
``<prefix>:{keys}:active`` — hash SHA-256 → JSON record, holding active keys only, so a lookup is one
``HGET``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import orjson

from proxy.core.redis_settings import RedisSettings
from proxy.credits.keys import ApiKey, CreatedKey, display_of, key_hash, matches, new_key, new_key_id
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
-- KEYS: records, active ; ARGV: key id, now
local text = redis.call('HGET', KEYS[1], ARGV[1])
if not text then return 0 end
local record = cjson.decode(text)
if record['revoked_at'] ~= cjson.null then return 0 end
record['revoked_at'] = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
redis.call('HDEL', KEYS[2], record['hash'])
return 1
"""


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
        self.clock = clock
        self._create = client.register_script(_CREATE)
        self._revoke = client.register_script(_REVOKE)

    @classmethod
    def from_url(
        cls, url: str, *, cluster: bool = False, timeout_s: float = 2.0, max_connections: int = 64, **options: Any
    ) -> RedisKeyStore:
        """A store on its own client for ``url`` (see :func:`~proxy.credits.redis_store.connect`)."""
        return cls(connect(url, cluster=cluster, timeout_s=timeout_s, max_connections=max_connections), **options)

    async def close(self) -> None:
        await self.client.aclose()

    async def create(self, user: str, tenant: str = "default", name: str = "") -> CreatedKey:
        plaintext = new_key()
        record = ApiKey(new_key_id(), user, tenant, name, display_of(plaintext), self.clock())
        digest = key_hash(plaintext)
        text = orjson.dumps({**asdict(record), "hash": digest})
        async with unavailable_on_failure("create key"):
            await self._create(keys=[self.records, self.active], args=[record.key_id, digest, text])
        return CreatedKey(record, plaintext)

    async def list(
        self, *, user: str | None = None, tenant: str | None = None, include_revoked: bool = False
    ) -> list[ApiKey]:
        async with unavailable_on_failure("list keys"):
            texts = await self.client.hvals(self.records)
        keys = [_record(text) for text in texts]
        keys.sort(key=lambda key: (key.created_at, key.key_id))
        return [key for key in keys if matches(key, user, tenant, include_revoked)]

    async def revoke(self, key_id: str) -> bool:
        async with unavailable_on_failure("revoke key"):
            return int(await self._revoke(keys=[self.records, self.active], args=[key_id, self.clock()])) == 1

    @reconnecting
    async def lookup(self, presented: str) -> ApiKey | None:
        async with unavailable_on_failure("look up key"):
            text = await self.client.hget(self.active, key_hash(presented))
        return None if text is None else _record(text)
