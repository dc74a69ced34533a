"""Shared mode: what a replica needs so that N replicas behind a load balancer act as one cache.

Switched on by ``redis.url``. :func:`build_shared` gives the runtime:

- ``l1``: a :class:`~tiers.near_cache.SharedResponseTier` over a bounded in-process near cache (the L1 memory
  budget: ``cache.l1.max_bytes``/``max_entries``/``policy``) in front of one :class:`~tiers.redis_store.RedisStore`
  (prefix ``<prefix>:l1``) that every replica shares, which admits and evicts by cost and size within
  ``redis.l1_max_bytes`` (compressed with ``redis.l1_compress``, split over ``redis.l1_shards``) and keeps the
  records of evicted entries for ``near_ttl_s`` + 1 s so that invalidations still reach their near copies;
- ``versions``: :class:`~tiers.redis_versions.RedisVersions` (synchronous ``current()``, awaited ``bump()``);
- ``bus``: the :class:`~tiers.invalidation_bus.InvalidationBus` keeping near copies and versions coherent;
- ``board``: a :class:`PrefixSummaryBoard` sharing per-backend prefix summaries for KV-aware routing.

Credits and API keys already switch to Redis on ``redis.url`` (``proxy.credits.factory``). Tiers that stay local
to a replica (the cold tier on local disk) can :meth:`SharedMode.follow` the bus so that key removals broadcast
by another replica reach them too.

Settings read: ``redis.url``, ``redis.cluster``, ``redis.timeout_s`` (the bound on one cache read/write), and
the :class:`SharedOptions` fields under ``redis.``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.asyncio.cluster import RedisCluster

from proxy.config import Settings
from proxy.observability.metrics import Metrics
from tiers.invalidation_bus import Delivery, InvalidationBus
from tiers.memory import MemoryStore
from tiers.near_cache import NearCachedStore, SharedResponseTier
from tiers.policies import make_policy
from tiers.redis_store import RedisStore
from tiers.redis_versions import RedisVersions
from tiers.response_tier import ResponseTier

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

    def __init__(self, client: aioredis.Redis | RedisCluster, backends: Sequence[str], *, prefix: str = "ragproxy",
                 ttl_s: float = 30.0, max_per_backend: int = 4096, refresh_s: float = 1.0,
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
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
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


@dataclass
class SharedMode:
    """The shared components of one replica; start/stop with the runtime."""

    l1: ResponseTier
    versions: RedisVersions
    bus: InvalidationBus
    board: PrefixSummaryBoard
    start_wait_s: float = 5.0
    _followed: list[ResponseTier] = field(default_factory=list)

    @property
    def near(self) -> NearCachedStore:
        store = self.l1.store
        assert isinstance(store, NearCachedStore)
        return store

    def follow(self, tier: ResponseTier) -> None:
        """Apply key removals and clears broadcast by any replica to this replica-local tier too."""
        if not self._followed:
            self.bus.on("keys", self._follow_keys)
            self.bus.on("clear", self._follow_clear)
        self._followed.append(tier)

    async def _follow_keys(self, message: dict[str, Any]) -> None:
        for tier in self._followed:
            for key in message.get("keys") or ():
                with contextlib.suppress(Exception):
                    await tier.store.delete(str(key))

    async def _follow_clear(self, _message: dict[str, Any]) -> None:
        for tier in self._followed:
            with contextlib.suppress(Exception):
                await tier.store.clear()

    def summary(self) -> dict[str, Any]:
        """For the admin API and dashboards: the bus's state, near-cache counters, the last broadcast."""
        near = self.near
        delivery = near.last_delivery or self.versions.last_delivery
        return {
            "replica": self.bus.replica_id, "bus_trusted": self.bus.trusted,
            "near_entries": len(near.near), "near_hits": near.near_hits, "shared_hits": near.shared_hits,
            "untrusted_misses": near.untrusted_misses, "shared_evictions": near.shared.evictions,
            "shared_bypassed": near.shared.bypassed,
            "last_broadcast": None if delivery is None else {
                "expected": delivery.expected, "acked": delivery.acked, "complete": delivery.complete,
                "missing": list(delivery.missing), "waited_ms": round(delivery.waited_s * 1000, 3)},
        }

    async def invalidate_keys(self, keys: Sequence[str]) -> Delivery:
        """Remove ``keys`` everywhere (Redis, every replica's near cache); returns how the replicas acknowledged."""
        return await self.near.delete_keys(list(keys))

    async def start(self) -> None:
        if not await self.bus.start(self.start_wait_s):
            log.warning("shared mode: invalidation bus not subscribed after %.0fs; serving without the shared "
                        "cache until it is", self.start_wait_s)
        self.board.start()

    async def stop(self) -> None:
        await self.board.stop()
        await self.near.stop_notices()
        await self.bus.stop()
        await self.l1.store.close()


@dataclass(frozen=True)
class SharedOptions:
    """Tuning of shared mode; each field is the setting ``redis.<field>``."""

    prefix: str = "ragproxy"
    near_ttl_s: float = 30.0
    bus_heartbeat_s: float = 0.5
    bus_lease_s: float = 3.0
    bus_ack_timeout_s: float = 1.0
    prefix_ttl_s: float = 30.0
    l1_max_bytes: int = 1024**3
    l1_shards: int = 0
    l1_compress: bool = True

    @property
    def tombstone_s(self) -> float:
        """How long the shared store keeps an evicted entry's record: near copies of it live at most
        ``near_ttl_s`` (plus a second for clock rates and in-flight reads)."""
        return self.near_ttl_s + 1.0

    @classmethod
    def from_settings(cls, settings: Settings) -> SharedOptions:
        defaults = cls()
        return cls(**{name: type(getattr(defaults, name))(getattr(settings.redis, name))
                      for name in cls.__dataclass_fields__})


def build_shared(settings: Settings, metrics: Metrics | None = None,
                 options: SharedOptions | None = None) -> SharedMode | None:
    """The shared components, or ``None`` in embedded mode (``redis.url`` unset)."""
    url = settings.redis.url
    if url is None:
        return None
    opts = options or SharedOptions.from_settings(settings)
    cluster = settings.redis.cluster or "+cluster://" in url

    failures = None if metrics is None else Counter(  # declared where it is recorded: shared mode only
        "ragproxy_dependency_failures_total", "Failures of a cache dependency (fail-open)", ["dependency"],
        registry=metrics.registry)

    def on_event(event: str) -> None:
        if metrics is not None:
            metrics.events.labels("bus", event).inc()
        if failures is not None and event == "lost":
            failures.labels("redis_bus").inc()

    bus = InvalidationBus(url, cluster=cluster, prefix=opts.prefix, heartbeat_s=opts.bus_heartbeat_s,
                          lease_s=opts.bus_lease_s, ack_timeout_s=opts.bus_ack_timeout_s, on_event=on_event)
    shards = opts.l1_shards or (16 if cluster else 1)
    shared_store = RedisStore(url, prefix=f"{opts.prefix}:l1", cluster=cluster,
                              timeout=max(settings.redis.timeout_s, 1.0), max_bytes=opts.l1_max_bytes,
                              shards=shards, compress=opts.l1_compress, keep_evicted_s=opts.tombstone_s)
    l1 = settings.cache.l1
    near = MemoryStore(make_policy(l1.policy, l1.max_bytes), max_entries=l1.max_entries)
    store = NearCachedStore(near, shared_store, bus, near_ttl_s=opts.near_ttl_s)
    tier = SharedResponseTier("l1", store, op_timeout=settings.redis.timeout_s)
    versions = RedisVersions(shared_store.client, bus, prefix=opts.prefix)
    board = PrefixSummaryBoard(shared_store.client, [b.label for b in settings.upstreams.llm], prefix=opts.prefix,
                               ttl_s=opts.prefix_ttl_s)
    return SharedMode(l1=tier, versions=versions, bus=bus, board=board)
