"""Shared mode: what a replica needs so that N replicas behind a load balancer act as one cache.

Switched on by ``redis.url``. :func:`build_shared` gives the runtime:

- ``l1``: a :class:`~tiers.near_cache.SharedResponseTier` over a bounded in-process near cache (the L1 memory
  budget: ``cache.l1.max_bytes``/``max_entries``/``policy``) in front of one :class:`~tiers.redis_store.RedisStore`
  (prefix ``<prefix>:l1``) that every replica shares, which admits and evicts by cost and size within
  ``redis.l1_max_bytes`` (compressed with ``redis.l1_compress``, split over ``redis.l1_shards``) and keeps the
  records of evicted entries for ``near_ttl_s`` + 1 s so that invalidations still reach their near copies;
- ``versions``: :class:`~tiers.redis_versions.RedisVersions` (synchronous ``current()``, awaited ``bump()``);
- ``bus``: the :class:`~tiers.invalidation_bus.InvalidationBus` keeping near copies and versions coherent;
- ``board``: a :class:`~proxy.kv.prefix_board.PrefixSummaryBoard` sharing per-backend prefix summaries for KV-aware
  routing.

Credits and API keys already switch to Redis on ``redis.url`` (``proxy.assembly.credit_components``). Tiers that
stay local to a replica (the cold tier on local disk) can :meth:`SharedMode.follow` the bus so that key removals
broadcast by another replica reach them too.

Settings read: ``redis.url``, ``redis.cluster``, ``redis.timeout_s`` (the bound on one cache read/write), and
the :class:`SharedOptions` fields under ``redis.``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter

from proxy.answers.settings import CacheSettings
from proxy.core.redis_settings import RedisSettings
from proxy.kv.prefix_board import PrefixSummaryBoard
from proxy.observability.metrics import Metrics
from proxy.upstream.settings import Upstreams
from tiers.invalidation_bus import Delivery, InvalidationBus
from tiers.memory import MemoryStore
from tiers.near_cache import NearCachedStore, SharedResponseTier
from tiers.policies import make_policy
from tiers.redis_store import RedisStore
from tiers.redis_versions import RedisVersions
from tiers.response_tier import ResponseTier

_REDIS = RedisSettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.shared")


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

    prefix: str = _REDIS.prefix
    near_ttl_s: float = _REDIS.near_ttl_s
    bus_heartbeat_s: float = _REDIS.bus_heartbeat_s
    bus_lease_s: float = _REDIS.bus_lease_s
    bus_ack_timeout_s: float = _REDIS.bus_ack_timeout_s
    prefix_ttl_s: float = _REDIS.prefix_ttl_s
    l1_max_bytes: int = _REDIS.l1_max_bytes
    l1_shards: int = _REDIS.l1_shards
    l1_compress: bool = _REDIS.l1_compress

    @property
    def tombstone_s(self) -> float:
        """How long the shared store keeps an evicted entry's record: near copies of it live at most
        ``near_ttl_s`` (plus a second for clock rates and in-flight reads)."""
        return self.near_ttl_s + 1.0

    @classmethod
    def from_settings(cls, settings: SharedConfig) -> SharedOptions:
        defaults = cls()
        return cls(**{name: type(getattr(defaults, name))(getattr(settings.redis, name))
                      for name in cls.__dataclass_fields__})


class SharedConfig(Protocol):
    """The settings shared mode is built from (:class:`proxy.assembly.config.Settings` is one)."""

    @property
    def redis(self) -> RedisSettings: ...

    @property
    def cache(self) -> CacheSettings: ...

    @property
    def upstreams(self) -> Upstreams: ...


def build_shared(settings: SharedConfig, metrics: Metrics | None = None,
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
