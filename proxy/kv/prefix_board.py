"""Prompt prefixes each backend probably holds, shared between proxy replicas through Redis (shared mode's
``board``, :mod:`proxy.cache_tiers.shared_mode`), so that every replica's KV-aware routing sees what the others sent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import quote

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from proxy.core.redis_settings import RedisSettings
from tiers.background import stop_task

_REDIS = RedisSettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.shared")


class PrefixSummaryBoard:
    """Which prompt prefixes each backend probably holds, as seen by every replica (approximate, bounded).

    A replica :meth:`record`\\ s the prefixes it sent to a backend (a cheap, synchronous append); a background
    loop publishes them every ``refresh_s`` and reads every backend's summary back into a local snapshot, which
    :meth:`cached_tokens` reads synchronously on the routing path.

    Layout: per backend ``<prefix>:kv:{b:<backend>}:prefixes``, a sorted set of ``<hash>:<tokens>`` members
    scored by their expiry (epoch ms). Every publish refreshes the expiry of what it records, drops expired
    members and keeps the ``max_per_backend`` most recently refreshed, so the set is bounded and forgets
    prefixes nobody sent within ``ttl_s`` — roughly when a backend's KV cache would have evicted them.
    """

    def __init__(self, client: aioredis.Redis | RedisCluster, backends: Sequence[str], *, prefix: str = _REDIS.prefix,
                 ttl_s: float = _REDIS.prefix_ttl_s, max_per_backend: int = 4096, refresh_s: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.backends = list(backends)
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.max_per_backend = max_per_backend
        self.refresh_s = refresh_s
        self._clock = clock
        self._outbox: dict[str, dict[str, int]] = {}
        self._snapshot: dict[str, dict[str, int]] = {}
        self._task: asyncio.Task[None] | None = None

    def _key(self, backend: str) -> str:
        return f"{self.prefix}:kv:{{b:{quote(backend, safe='')}}}:prefixes"

    def record(self, backend: str, prefixes: Iterable[tuple[str, int]]) -> None:
        """Note that ``backend`` was sent these ``(path hash, tokens)`` prefixes (published on the next round)."""
        box = self._outbox.setdefault(backend, {})
        for digest, tokens in prefixes:
            box[digest] = tokens
            self._snapshot.setdefault(backend, {})[digest] = tokens
        while len(box) > self.max_per_backend:
            box.pop(next(iter(box)))

    def cached_tokens(self, backend: str, hashes: Sequence[str]) -> int:
        """Tokens of the longest prefix of ``hashes`` (``prefix_hashes``) that ``backend`` probably holds."""
        known = self._snapshot.get(backend, {})
        best = 0
        for digest in hashes:
            tokens = known.get(digest)
            if tokens is None:
                break
            best = tokens
        return best

    async def publish(self) -> None:
        outbox, self._outbox = self._outbox, {}
        now_ms = int(self._clock() * 1000)
        expiry = now_ms + int(self.ttl_s * 1000)
        for backend, prefixes in outbox.items():
            key = self._key(backend)
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(key, {f"{digest}:{tokens}": expiry for digest, tokens in prefixes.items()})
            pipe.zremrangebyscore(key, "-inf", now_ms)
            pipe.zremrangebyrank(key, 0, -(self.max_per_backend + 1))
            pipe.pexpire(key, int(self.ttl_s * 1000))
            await pipe.execute()

    async def refresh(self) -> None:
        now_ms = int(self._clock() * 1000)
        for backend in self.backends:
            members = await self.client.zrangebyscore(self._key(backend), now_ms, "+inf")
            known: dict[str, int] = {}
            for member in members:
                text = member.decode() if isinstance(member, bytes) else str(member)
                digest, _, tokens = text.rpartition(":")
                known[digest] = max(known.get(digest, 0), int(tokens))
            self._snapshot[backend] = known

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="prefix-board")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.publish()
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # routing quality degrades, nothing else: keep the last snapshot
                log.debug("prefix board: %s", exc)
            await asyncio.sleep(self.refresh_s)
