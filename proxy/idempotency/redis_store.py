"""Idempotency-key records in Redis, shared by every replica (semantics in :mod:`proxy.idempotency.stage`, bounds
in :mod:`proxy.idempotency.records`).

Per user (``<scope>``, the user digest, as the hash tag: all of a user's keys share a Redis Cluster slot):

* ``<prefix>:{<scope>}:<key>`` — one hash per key: ``fp`` (the request's fingerprint), ``owner`` (the claim's
  token) and, once the first request finished, ``answer``. A running claim expires after the running TTL, a kept
  answer after ``ttl_s``;
* ``<prefix>:{<scope>}#keys`` — a sorted set of the user's keys by claim time (ms), at most ``per_user`` of them
  (no record's name has ``#`` right after the tag): a claim past the cap drops the oldest whose record is gone or
  finished, never a running claim (``full`` when there is none). It lives as long as the user's longest record
  could (``ttl_s``);
* ``<prefix>:{<scope>}#bytes`` — a hash of the user's kept keys → the bytes each counts
  (:func:`~proxy.idempotency.records.held_bytes`, rounded up as Redis allocates it: :func:`allocated`), and their
  sum under `` total`` (a space: no key's name). A kept answer that would take the user past ``max_bytes_per_user``
  first drops the user's oldest gone or finished records; when that is not enough the answer is not kept and its
  claim is dropped.

In all (one Redis Cluster slot, tag ``{#budget}``, which no user digest is):

* ``<prefix>:{#budget}users`` — a sorted set of users by the bytes they hold (as their last keep or trim counted);
* ``<prefix>:{#budget}seen`` — users by when their last kept answer expires: past it, their bytes leave the count;
* ``<prefix>:{#budget}total`` — the sum of ``users``;
* ``<prefix>:{#budget}read`` — when each user's count was read (Redis's clock, µs, on the user's server): a count
  older than the one held, from a replica that was overtaken, is not taken.

Past ``max_bytes`` in all, a keep trims the user holding the most bytes (its oldest gone or finished record) until
the total fits. Each step is one Lua script, atomic across replicas; a user's and the overall count are two steps,
so concurrent keeps can pass ``max_bytes`` by at most the answers in flight until the next keep trims them. The
counts can only overstate what Redis holds (a record that expired is counted until a scan passes it), so the bound
holds. Each per-user script reaches the user's other records by name (in the same Cluster slot, by their tag). A
claim run twice by the same owner (the client retried after a connection dropped) finds its own claim: ``claimed``
again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proxy.core.redis_settings import RedisSettings
from proxy.idempotency.records import Claim, Claimed, Full, Kept, Mismatch, Running, held_bytes
from proxy.idempotency.settings import IdempotencySettings
from proxy.stores.redis_client import RedisClient, as_text, connect, reconnecting, unavailable_on_failure
from proxy.stores.redis_wipe import WipeWatch

_SETTINGS, _REDIS = IdempotencySettings(), RedisSettings()  # the defaults, defined once there

ROOM = """
local function used(sizes) return tonumber(redis.call('HGET', sizes, ' total') or '0') end
-- when a count was read: Redis's clock (µs), so that the overall count takes a user's counts in the order they were
-- made (all of a user's keys live on one server)
local function now_us() local t = redis.call('TIME') return tonumber(t[1]) * 1000000 + tonumber(t[2]) end
local function drop(prefix, index, sizes, key)
  redis.call('DEL', prefix .. key)
  redis.call('ZREM', index, key)
  local size = redis.call('HGET', sizes, key)
  if size then
    redis.call('HDEL', sizes, key)
    redis.call('HINCRBY', sizes, ' total', -tonumber(size))
  end
end
-- drop gone or finished records, oldest first, until the user holds at most `keys` keys and `bytes` bytes
local function make_room(prefix, index, sizes, keys, bytes)
  if redis.call('ZCARD', index) <= keys and used(sizes) <= bytes then return true end
  for _, key in ipairs(redis.call('ZRANGE', index, 0, -1)) do
    local record = prefix .. key
    if redis.call('EXISTS', record) == 0 or redis.call('HEXISTS', record, 'answer') == 1 then
      drop(prefix, index, sizes, key)
      if redis.call('ZCARD', index) <= keys and used(sizes) <= bytes then return true end
    end
  end
  return false
end
"""

CLAIM = ROOM + """
-- KEYS: the record, the user's keys, their bytes ; ARGV: fingerprint, owner, running TTL ms, key, now ms, cap,
-- index TTL ms
local fp = redis.call('HGET', KEYS[1], 'fp')
if fp then
  if fp ~= ARGV[1] then return {'mismatch'} end
  local answer = redis.call('HGET', KEYS[1], 'answer')
  if answer then return {'kept', answer} end
  if redis.call('HGET', KEYS[1], 'owner') == ARGV[2] then return {'claimed'} end
  return {'running'}
end
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[4])
if not make_room(prefix, KEYS[2], KEYS[3], tonumber(ARGV[6]) - 1, math.huge) then return {'full'} end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'owner', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return {'claimed'}
"""

KEEP = ROOM + """
-- KEYS: the record, the user's keys, their bytes ; ARGV: owner, answer, TTL ms, key, bytes it counts, the user's
-- byte budget ; returns {1 kept or 0, the bytes the user holds, when that was read (µs)}
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'answer') == 1 then
  return {0, used(KEYS[3]), now_us()}
end
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[4])
local size = tonumber(ARGV[5])
if size > tonumber(ARGV[6]) or not make_room(prefix, KEYS[2], KEYS[3], math.huge, tonumber(ARGV[6]) - size) then
  drop(prefix, KEYS[2], KEYS[3], ARGV[4])
  return {0, used(KEYS[3]), now_us()}
end
redis.call('HSET', KEYS[1], 'answer', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[4], size)
redis.call('HINCRBY', KEYS[3], ' total', size)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {1, used(KEYS[3]), now_us()}
"""

TRIM = ROOM + """
-- KEYS: the user's keys, their bytes ; ARGV: the prefix of the user's records ; drop its oldest gone or finished
-- record holding bytes ; returns {1 dropped or 0 none, the bytes the user holds, when that was read (µs)}
local held = used(KEYS[2])
return {make_room(ARGV[1], KEYS[1], KEYS[2], math.huge, held - 1) and 1 or 0, used(KEYS[2]), now_us()}
"""

FREE = """
-- KEYS: the record, the user's keys ; ARGV: owner, key
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'answer') == 1 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[2])
return redis.call('DEL', KEYS[1])
"""

ACCOUNT = """
-- KEYS: users by bytes, users by expiry, total, when each user's count was read ; ARGV: user, bytes it holds, its
-- expiry ms, now ms, when its count was read (µs; an older count than the one held is not taken)
-- returns {total, the user holding the most (among equals, not this one), its bytes}
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[4], 'LIMIT', 0, 100)) do
  local held = redis.call('ZSCORE', KEYS[1], gone)
  if held then redis.call('DECRBY', KEYS[3], held) end
  redis.call('ZREM', KEYS[1], gone)
  redis.call('ZREM', KEYS[2], gone)
  redis.call('HDEL', KEYS[4], gone)
end
if tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0') <= tonumber(ARGV[5]) then
  local before = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
  local held = tonumber(ARGV[2])
  redis.call('INCRBY', KEYS[3], held - before)
  if held > 0 then
    redis.call('ZADD', KEYS[1], held, ARGV[1])
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
    redis.call('HSET', KEYS[4], ARGV[1], ARGV[5])
  else
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('HDEL', KEYS[4], ARGV[1])
  end
end
local top = redis.call('ZREVRANGE', KEYS[1], 0, 1, 'WITHSCORES')
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
if top[1] == ARGV[1] and top[3] and top[4] == top[2] then return {total, top[3], tonumber(top[4])} end
return {total, top[1] or '', tonumber(top[2] or '0')}
"""

def allocated(size: int) -> int:
    """The bytes Redis's allocator (jemalloc) takes for a value of ``size`` bytes: above 16 KiB, sizes come in four
    classes per power of two, so a 3.6 MiB answer takes 4 MiB. The budgets count this, not the answer's length."""
    if size <= 16 * 1024:
        return size
    step = 1 << ((size - 1).bit_length() - 3)
    return -(-size // step) * step


_MOST_TRIMS = 64
"""Trims one keep makes at most to bring the overall count under ``max_bytes``."""


class RedisIdempotencyStore:
    """Idempotency-key records shared through Redis."""

    def __init__(self, client: RedisClient, *, prefix: str = "ragproxy:idem",
                 per_user: int = _SETTINGS.max_entries_per_user, max_bytes: int = _SETTINGS.max_bytes,
                 max_bytes_per_user: int = _SETTINGS.max_bytes_per_user, ttl_s: float = _SETTINGS.ttl_s,
                 clock: Callable[[], float] = time.time, reconnect_s: float = _REDIS.reconnect_s) -> None:
        """``ttl_s``: how long a kept answer lives (and a user's key index after its last claim); ``reconnect_s``:
        how long an operation waits out a restarting Redis (:func:`~proxy.stores.redis_client.reconnecting`)."""
        self.client = client
        self.max_bytes = max_bytes
        self.max_bytes_per_user = max_bytes_per_user
        self.reconnect_s = reconnect_s
        self.wipe: WipeWatch | None = None
        self.prefix = prefix
        self.per_user = per_user
        self.ttl_s = ttl_s
        self.clock = clock
        self._claim = client.register_script(CLAIM)
        self._keep = client.register_script(KEEP)
        self._free = client.register_script(FREE)
        self._trim = client.register_script(TRIM)
        self._account = client.register_script(ACCOUNT)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> RedisIdempotencyStore:
        return cls(connect(url, cluster=cluster), **options)

    def _key(self, scope: str, key: str) -> str:
        return f"{self.prefix}:{{{scope}}}:{key}"

    def _index(self, scope: str) -> str:
        return f"{self.prefix}:{{{scope}}}#keys"

    def _sizes(self, scope: str) -> str:
        return f"{self.prefix}:{{{scope}}}#bytes"

    async def _count(self, scope: str, held: int, read_us: int) -> tuple[int, str, int]:
        """Record that ``scope`` held ``held`` bytes at ``read_us`` (Redis's clock); the overall total, and the user
        holding the most."""
        budget = f"{self.prefix}:{{#budget}}"
        now_ms = int(self.clock() * 1000)
        keys = [budget + "users", budget + "seen", budget + "total", budget + "read"]
        total, top, top_held = await self._account(keys=keys, args=[scope, held, now_ms + int(self.ttl_s * 1000),
                                                                    now_ms, read_us])
        return int(total), as_text(top), int(top_held)

    @reconnecting
    async def claim(self, scope: str, key: str, print_: str, owner: str, running_ttl_s: float) -> Claim:
        args: list[str | int] = [print_, owner, int(running_ttl_s * 1000), key, int(self.clock() * 1000), self.per_user,
                int(self.ttl_s * 1000)]
        async with unavailable_on_failure("idempotency claim"):
            result = await self._claim(keys=[self._key(scope, key), self._index(scope), self._sizes(scope)], args=args)
        outcome = as_text(result[0])
        if outcome == "kept":
            return Kept(bytes(result[1]))
        if outcome == "claimed":
            return Claimed()
        if outcome == "full":
            return Full()
        return Mismatch() if outcome == "mismatch" else Running()

    @reconnecting
    async def keep(self, scope: str, key: str, owner: str, answer: bytes, ttl_s: float) -> bool:
        args: list[str | int | bytes] = [owner, answer, int(ttl_s * 1000), key, allocated(held_bytes(key, answer)),
                                         min(self.max_bytes_per_user, self.max_bytes)]
        async with unavailable_on_failure("idempotency keep"):
            kept, held, read_us = await self._keep(
                keys=[self._key(scope, key), self._index(scope), self._sizes(scope)], args=args)
            total, top, _ = await self._count(scope, int(held), int(read_us))
            for _ in range(_MOST_TRIMS):
                if total <= self.max_bytes or not top:
                    break
                trimmed, top_held, read_us = await self._trim(keys=[self._index(top), self._sizes(top)],
                                                              args=[f"{self.prefix}:{{{top}}}:"])
                total, top, _ = await self._count(top, int(top_held), int(read_us))
                if not trimmed:
                    break
        return bool(kept)

    @reconnecting
    async def free(self, scope: str, key: str, owner: str) -> None:
        async with unavailable_on_failure("idempotency free"):
            await self._free(keys=[self._key(scope, key), self._index(scope)], args=[owner, key])

    async def close(self) -> None:
        await self.client.aclose()
