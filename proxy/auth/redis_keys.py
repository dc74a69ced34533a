"""API keys, and the limits of users and tenants, in Redis (see :mod:`proxy.auth.keys`).

Layout, all under the hash tag ``{keys}`` (one Cluster slot, so each change — one Lua script — is atomic; key
counts are small): ``<prefix>:{keys}:records`` — hash key id → JSON record (with its hash and limits);
``<prefix>:{keys}:active`` — hash SHA-256 → JSON record, holding active keys only, so a lookup is one ``HGET``;
``<prefix>:{keys}:limits`` — hash ``user:<name>`` / ``tenant:<name>`` → JSON limits; the change feed:
``<prefix>:{keys}:seq`` — the count of changes, and ``<prefix>:{keys}:changes`` — zset ``key:<id>`` /
``user:<name>`` / ``tenant:<name>`` → the position of its last change (one member per key, user or tenant, so it
holds no more than the records do).

A change to a key or to limits is a compare-and-set: the record is read, edited in Python, and written by a script
only if it is still the one read (read again and retried otherwise), so concurrent admin calls never lose one
another's change and an edit never brings a revoked key back.

A Redis that lost its data is not believed (:class:`~proxy.stores.redis_wipe.WipeWatch`): every operation is
refused while the watch knows it, and what an empty Redis would answer wrongly in the moment before the watch
notices reads the sentinel again — a key or limits written (so no 201 names a key the restore will not have), a
revocation or a change that found no key (a 503, not a 404), a lookup that found none (a 503, not a 401), a feed
that went back.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import orjson

from proxy.auth.keys import (
    ApiKey,
    CreatedKey,
    KeyChanges,
    check_scope_kind,
    display_of,
    key_hash,
    limits_from,
    limits_json,
    matches,
    new_key,
    new_key_id,
    quota_of,
)
from proxy.core.handoffs import NO_LIMITS, Limits, Quota, Scope
from proxy.core.redis_settings import RedisSettings
from proxy.stores.redis_client import RedisClient, connect, reconnecting, unavailable_on_failure
from proxy.stores.redis_wipe import WipeWatch
from proxy.stores.unavailable import StoreUnavailable

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
redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[3]), 'key:' .. ARGV[1])
return 1
"""

_REPLACE_KEY = """
-- KEYS: records, active, seq, changes ; ARGV: key id, record read, record written, hash
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[3])
redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[3]), 'key:' .. ARGV[1])
return 1
"""

_REPLACE_LIMITS = """
-- KEYS: limits, seq, changes ; ARGV: member, limits read ('' = none), limits written ('' = none)
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[2]), ARGV[1])
return 1
"""

_CHANGES = """
-- KEYS: records, seq, changes, limits ; ARGV: since, page ; -> {seq, member, position, record or limits, ...}
local seq = tonumber(redis.call('GET', KEYS[2]) or '0')
local out = {seq}
local changed = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[2])
for i = 1, #changed, 2 do
  local member = changed[i]
  local now
  if string.sub(member, 1, 4) == 'key:' then now = redis.call('HGET', KEYS[1], string.sub(member, 5))
  else now = redis.call('HGET', KEYS[4], member) end
  out[#out + 1] = member
  out[#out + 1] = changed[i + 1]
  out[#out + 1] = now or ''
end
return out
"""

CHANGES_PAGE = 500
"""Changes read from the feed at most per call."""
EDIT_TRIES = 20
"""Compare-and-set attempts of one change before it counts as unavailable (others kept changing the record)."""


def _record(text: Any) -> ApiKey:
    fields = orjson.loads(text)
    fields.pop("hash", None)
    limits = limits_from(fields.pop("limits", None))
    return ApiKey(**fields, limits=limits)


def _encoded(record: ApiKey, digest: str) -> bytes:
    return orjson.dumps({**asdict(record), "limits": limits_json(record.limits), "hash": digest})


def _limits_text(limits: Limits) -> bytes:
    """Limits as stored (``b""``: none, the field is removed)."""
    fields = limits_json(limits)
    return orjson.dumps(fields) if fields else b""


def _limits(text: Any) -> Limits:
    return limits_from(orjson.loads(text)) if text else Limits()


def _scope(member: str, text: Any) -> Scope:
    kind, _, name = member.partition(":")
    return Scope(kind, name, _limits(text))


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
        self.limits = f"{prefix}:{{keys}}:limits"
        self.seq = f"{prefix}:{{keys}}:seq"
        self.changed = f"{prefix}:{{keys}}:changes"
        self.clock = clock
        self._create = client.register_script(_CREATE)
        self._revoke = client.register_script(_REVOKE)
        self._replace_key = client.register_script(_REPLACE_KEY)
        self._replace_limits = client.register_script(_REPLACE_LIMITS)
        self._changes = client.register_script(_CHANGES)

    @classmethod
    def from_url(
        cls, url: str, *, cluster: bool = False, timeout_s: float = 2.0, max_connections: int = 64, **options: Any
    ) -> RedisKeyStore:
        """A store on its own client for ``url`` (see :func:`~proxy.stores.redis_client.connect`)."""
        return cls(connect(url, cluster=cluster, timeout_s=timeout_s, max_connections=max_connections), **options)

    async def close(self) -> None:
        await self.client.aclose()

    def _refuse(self) -> None:
        if self.wipe is not None:
            self.wipe.refuse()

    async def _confirm(self) -> None:
        """Refused (:class:`StoreUnavailable`) when the sentinel says Redis lost its data (read now)."""
        if self.wipe is not None:
            await self.wipe.confirm()

    async def create(self, user: str, tenant: str = "default", name: str = "", *, expires_at: float | None = None,
                     limits: Limits = NO_LIMITS) -> CreatedKey:
        self._refuse()
        plaintext = new_key()
        record = ApiKey(new_key_id(), user, tenant, name, display_of(plaintext), self.clock(), expires_at=expires_at,
                        limits=limits)
        digest = key_hash(plaintext)
        async with unavailable_on_failure("create key"):
            await self._create(keys=[self.records, self.active], args=[record.key_id, digest,
                                                                       _encoded(record, digest)])
            await self._confirm()  # written into a Redis that lost its data: the restore would not have it
        return CreatedKey(record, plaintext)

    async def get(self, key_id: str) -> ApiKey | None:
        self._refuse()
        async with unavailable_on_failure("read key"):
            text = await self.client.hget(self.records, key_id)
            if text is None:
                await self._confirm()
        return None if text is None else _record(text)

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

    async def update(self, key_id: str, edit: Callable[[ApiKey], ApiKey]) -> ApiKey | None:
        self._refuse()
        for _ in range(EDIT_TRIES):
            async with unavailable_on_failure("read key"):
                text = await self.client.hget(self.records, key_id)
                if text is None:
                    await self._confirm()
            if text is None:
                return None
            key = _record(text)
            if not key.active:
                return None
            wanted = edit(key)
            changed = replace(key, name=wanted.name, expires_at=wanted.expires_at, limits=wanted.limits)
            digest = str(orjson.loads(text)["hash"])
            async with unavailable_on_failure("change key"):
                written = await self._replace_key(keys=[self.records, self.active, self.seq, self.changed],
                                                  args=[key_id, text, _encoded(changed, digest), digest])
                if int(written) == 1:
                    await self._confirm()
                    return changed
        raise StoreUnavailable(f"key {key_id} kept changing while it was being changed; retry")

    @reconnecting
    async def lookup(self, presented: str) -> ApiKey | None:
        async with unavailable_on_failure("look up key"):
            text = await self.client.hget(self.active, key_hash(presented))
            if text is None:
                await self._confirm()  # unknown to an empty Redis is not unknown
        return None if text is None else _record(text)

    async def scope_limits(self, kind: str, name: str) -> Limits:
        self._refuse()
        async with unavailable_on_failure("read limits"):
            text = await self.client.hget(self.limits, f"{check_scope_kind(kind)}:{name}")
        return _limits(text)

    async def set_scope_limits(self, kind: str, name: str, edit: Callable[[Limits], Limits]) -> Limits:
        self._refuse()
        member = f"{check_scope_kind(kind)}:{name}"
        for _ in range(EDIT_TRIES):
            async with unavailable_on_failure("read limits"):
                text = await self.client.hget(self.limits, member) or b""
            limits = edit(_limits(text))
            async with unavailable_on_failure("change limits"):
                written = await self._replace_limits(keys=[self.limits, self.seq, self.changed],
                                                     args=[member, text, _limits_text(limits)])
                if int(written) == 1:
                    await self._confirm()
                    return limits
        raise StoreUnavailable(f"the limits of {member} kept changing while they were being changed; retry")

    async def limited_scopes(self) -> builtins.list[Scope]:
        self._refuse()
        async with unavailable_on_failure("list limits"):
            found = await self.client.hgetall(self.limits)
        scopes = [_scope(member.decode() if isinstance(member, bytes) else str(member), text)
                  for member, text in found.items()]
        return sorted((scope for scope in scopes if scope.limits.limited), key=lambda scope: (scope.kind, scope.name))

    @reconnecting
    async def quota(self, key: ApiKey) -> Quota:
        async with unavailable_on_failure("read limits"):
            user, tenant = await self.client.hmget(self.limits, [f"user:{key.user}", f"tenant:{key.tenant}"])
        return quota_of(key, _limits(user), _limits(tenant))

    @reconnecting
    async def changes(self, since: int | None) -> KeyChanges:
        async with unavailable_on_failure("read key changes"):
            found = await self._changes(keys=[self.records, self.seq, self.changed, self.limits],
                                        args=[-1 if since is None else since, 0 if since is None else CHANGES_PAGE])
            seq = int(found[0])
            if since is not None and seq < since:
                await self._confirm()  # the feed went back: its data went
        keys: list[tuple[str, ApiKey]] = []
        scopes: list[Scope] = []
        for member, text in zip(found[1::3], found[3::3], strict=True):
            name = member.decode() if isinstance(member, bytes) else str(member)
            if name.startswith("key:"):
                if text:
                    keys.append((str(orjson.loads(text)["hash"]), _record(text)))
            else:
                scopes.append(_scope(name, text))
        if len(found) - 1 == 3 * CHANGES_PAGE:  # a full page: more after its last change
            seq = int(float(found[-2]))
        return KeyChanges(seq, keys, scopes)
