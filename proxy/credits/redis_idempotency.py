"""Idempotency-key records in Redis, shared by every replica (semantics in :mod:`proxy.credits.idempotency`).

Per user (``<scope>``, the user digest, as the hash tag: all of a user's keys share a Redis Cluster slot):

* ``<prefix>:{<scope>}:<key>`` — one hash per key: ``fp`` (the request's fingerprint), ``owner`` (the claim's
  token) and, once the first request finished, ``answer``. A running claim expires after the running TTL, a kept
  answer after ``ttl_s``;
* ``<prefix>:{<scope>}#keys`` — a sorted set of the user's keys by claim time (ms), at most ``per_user`` of them
  (no record's name has ``#`` right after the tag): a claim past the cap drops the oldest whose record is gone or
  finished, never a running claim (``full`` when there is none). It lives as long as the user's longest record
  could (``ttl_s``).

Each operation is one Lua script, atomic across replicas; the claim reaches the user's other records by name (in
the same Cluster slot, by their tag). A claim run twice by the same owner (the client retried after a connection
dropped) finds its own claim: ``claimed`` again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proxy.credits.idempotency import Claim, Claimed, Full, Kept, Mismatch, Running
from proxy.credits.redis_store import RedisClient, _text, connect, reconnecting, unavailable_on_failure

CLAIM = """
-- KEYS: the record, the user's keys ; ARGV: fingerprint, owner, running TTL ms, key, now ms, cap, index TTL ms
local fp = redis.call('HGET', KEYS[1], 'fp')
if fp then
  if fp ~= ARGV[1] then return {'mismatch'} end
  local answer = redis.call('HGET', KEYS[1], 'answer')
  if answer then return {'kept', answer} end
  if redis.call('HGET', KEYS[1], 'owner') == ARGV[2] then return {'claimed'} end
  return {'running'}
end
local cap = tonumber(ARGV[6])
local held = redis.call('ZCARD', KEYS[2])
if held >= cap then
  local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[4])
  for _, key in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local record = prefix .. key
    if redis.call('EXISTS', record) == 0 or redis.call('HEXISTS', record, 'answer') == 1 then
      redis.call('DEL', record)
      redis.call('ZREM', KEYS[2], key)
      held = held - 1
      if held < cap then break end
    end
  end
  if held >= cap then return {'full'} end
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'owner', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return {'claimed'}
"""

KEEP = """
-- KEYS: the record ; ARGV: owner, answer, TTL ms
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'answer') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'answer', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

FREE = """
-- KEYS: the record, the user's keys ; ARGV: owner, key
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'answer') == 1 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[2])
return redis.call('DEL', KEYS[1])
"""


class RedisIdempotencyStore:
    """Idempotency-key records shared through Redis."""

    def __init__(self, client: RedisClient, *, prefix: str = "ragproxy:idem", per_user: int = 1_000,
                 ttl_s: float = 86_400.0, clock: Callable[[], float] = time.time, reconnect_s: float = 2.0) -> None:
        """``ttl_s``: how long a kept answer lives (and a user's key index after its last claim); ``reconnect_s``:
        how long an operation waits out a restarting Redis (:func:`~proxy.credits.redis_store.reconnecting`)."""
        self.client = client
        self.reconnect_s = reconnect_s
        self.prefix = prefix
        self.per_user = per_user
        self.ttl_s = ttl_s
        self.clock = clock
        self._claim = client.register_script(CLAIM)
        self._keep = client.register_script(KEEP)
        self._free = client.register_script(FREE)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> RedisIdempotencyStore:
        return cls(connect(url, cluster=cluster), **options)

    def _key(self, scope: str, key: str) -> str:
        return f"{self.prefix}:{{{scope}}}:{key}"

    def _index(self, scope: str) -> str:
        return f"{self.prefix}:{{{scope}}}#keys"

    @reconnecting
    async def claim(self, scope: str, key: str, print_: str, owner: str, running_ttl_s: float) -> Claim:
        args: list[str | int] = [print_, owner, int(running_ttl_s * 1000), key, int(self.clock() * 1000), self.per_user,
                int(self.ttl_s * 1000)]
        async with unavailable_on_failure("idempotency claim"):
            result = await self._claim(keys=[self._key(scope, key), self._index(scope)], args=args)
        outcome = _text(result[0])
        if outcome == "kept":
            return Kept(bytes(result[1]))
        if outcome == "claimed":
            return Claimed()
        if outcome == "full":
            return Full()
        return Mismatch() if outcome == "mismatch" else Running()

    @reconnecting
    async def keep(self, scope: str, key: str, owner: str, answer: bytes, ttl_s: float) -> None:
        async with unavailable_on_failure("idempotency keep"):
            await self._keep(keys=[self._key(scope, key)], args=[owner, answer, int(ttl_s * 1000)])

    @reconnecting
    async def free(self, scope: str, key: str, owner: str) -> None:
        async with unavailable_on_failure("idempotency free"):
            await self._free(keys=[self._key(scope, key), self._index(scope)], args=[owner, key])

    async def close(self) -> None:
        await self.client.aclose()
