"""Idempotency-key records in Redis, shared by every replica (semantics in :mod:`proxy.credits.idempotency`).

One hash per key, ``<prefix>:{<scope>}:<key>`` (the scope is the user digest, so all of a user's keys share a Redis
Cluster slot): ``fp`` (the request's fingerprint) and, once the first request finished, ``answer``. A running
claim expires after the running TTL, a kept answer after ``ttl_s``. Each operation is one Lua script, atomic across
replicas.
"""

from __future__ import annotations

from typing import Any

from proxy.credits.idempotency import Claim, Claimed, Kept, Mismatch, Running
from proxy.credits.redis_store import RedisClient, _text, connect, unavailable_on_failure

CLAIM = """
-- KEYS: the record ; ARGV: fingerprint, running TTL ms
local fp = redis.call('HGET', KEYS[1], 'fp')
if not fp then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'claimed'}
end
if fp ~= ARGV[1] then return {'mismatch'} end
local answer = redis.call('HGET', KEYS[1], 'answer')
if not answer then return {'running'} end
return {'kept', answer}
"""

KEEP = """
-- KEYS: the record ; ARGV: fingerprint, answer, TTL ms
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'answer') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'answer', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

FREE = """
-- KEYS: the record ; ARGV: fingerprint
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'answer') == 1 then return 0 end
return redis.call('DEL', KEYS[1])
"""


class RedisIdempotencyStore:
    """Idempotency-key records shared through Redis."""

    def __init__(self, client: RedisClient, *, prefix: str = "ragproxy:idem") -> None:
        self.client = client
        self.prefix = prefix
        self._claim = client.register_script(CLAIM)
        self._keep = client.register_script(KEEP)
        self._free = client.register_script(FREE)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> RedisIdempotencyStore:
        return cls(connect(url, cluster=cluster), **options)

    def _key(self, scope: str, key: str) -> str:
        return f"{self.prefix}:{{{scope}}}:{key}"

    async def claim(self, scope: str, key: str, print_: str, running_ttl_s: float) -> Claim:
        async with unavailable_on_failure("idempotency claim"):
            result = await self._claim(keys=[self._key(scope, key)], args=[print_, int(running_ttl_s * 1000)])
        outcome = _text(result[0])
        if outcome == "kept":
            return Kept(bytes(result[1]))
        if outcome == "claimed":
            return Claimed()
        return Mismatch() if outcome == "mismatch" else Running()

    async def keep(self, scope: str, key: str, print_: str, answer: bytes, ttl_s: float) -> None:
        async with unavailable_on_failure("idempotency keep"):
            await self._keep(keys=[self._key(scope, key)], args=[print_, answer, int(ttl_s * 1000)])

    async def free(self, scope: str, key: str, print_: str) -> None:
        async with unavailable_on_failure("idempotency free"):
            await self._free(keys=[self._key(scope, key)], args=[print_])

    async def close(self) -> None:
        await self.client.aclose()
