"""The stores of three features built together from the settings: the key store (:mod:`proxy.auth`), the
idempotency store (:mod:`proxy.idempotency`) and the credit store with its price book, reaper and journal
(:mod:`proxy.credits`). Built here, above the features, because in shared mode one watch for a wiped Redis
(:class:`~proxy.stores.redis_wipe.WipeWatch`) guards all three.

Embedded mode keeps keys, limits, budget spend and the ledger in one SQLite file under ``data_dir`` (idempotency keys
and rate-limit buckets in memory); shared mode (``redis.url`` set) keeps them all in Redis so every replica sees the
same balances, keys and limits — a Redis that must persist them (checked at start: :mod:`proxy.credits.persistence`).
Either credit store is wrapped in a :class:`~proxy.credits.journaled_store.JournaledCreditStore`, whose settlement
journal (``data_dir/credit-journal.sqlite3``) and outage allowance carry billing through an outage of the store.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from proxy.auth.keys import KeyStore
from proxy.auth.known_keys import KnownKeys
from proxy.auth.settings import AuthSettings
from proxy.core.redis_settings import RedisSettings
from proxy.credits.journal import SettlementJournal
from proxy.credits.journaled_store import JournaledCreditStore
from proxy.credits.outage import OutageAllowance
from proxy.credits.pricing import ModelLimits, ModelPrice, PriceBook, to_micro
from proxy.credits.reaper import ReservationReaper
from proxy.credits.replayer import JournalReplayer
from proxy.credits.settings import CreditsSettings
from proxy.credits.store import CreditStore
from proxy.idempotency.memory_store import MemoryIdempotencyStore
from proxy.idempotency.records import IdempotencyStore
from proxy.idempotency.settings import IdempotencySettings
from proxy.observability.metrics import Metrics
from proxy.rate_limits.counters import LimitCounters, LocalLimitCounters

if TYPE_CHECKING:
    from proxy.credits.redis_store import RedisCreditStore
    from proxy.stores.redis_wipe import WipeWatch


@dataclass
class CreditComponents:
    """Everything identification and billing need; stores are ``None`` when not configured."""

    keys: KeyStore | None
    store: CreditStore | None
    prices: PriceBook
    reaper: ReservationReaper | None
    replayer: JournalReplayer | None = None
    known_keys: KnownKeys = field(default_factory=KnownKeys)
    """Keys verified lately (the identify stage's memory: it outlives a rebuilt stage), kept true by the key
    store's change feed while the components run."""
    settling: set[asyncio.Task[None]] = field(default_factory=set)
    """Settlements the credits stage retries in the background (waited for at shutdown)."""
    idempotency: IdempotencyStore | None = None
    persistence_check: Callable[[], Awaitable[object]] | None = None
    """Refuses or warns about a credit store that would not survive a restart (Redis), run first at start."""
    wipe: WipeWatch | None = None
    """Notices a Redis that lost its data after the start (keys or credits in Redis); the owners of stored responses
    consult it too."""
    counters: LimitCounters | None = None
    """The rate-limit buckets and budget spend of keys, users and tenants (with API keys)."""
    limits_refused: Counter[str] = field(default_factory=Counter)
    """Requests the rate_limits stage refused since the start, by the limit that refused them (``requests``,
    ``tokens``, ``budget``; it outlives a rebuilt stage)."""

    @property
    def journaled(self) -> JournaledCreditStore | None:
        return self.store if isinstance(self.store, JournaledCreditStore) else None

    async def start(self) -> None:
        """Check the store keeps what it is given, start the reaper, and the replayer (after taking over what a
        previous process journaled)."""
        if self.persistence_check is not None:
            await self.persistence_check()
        if self.wipe is not None:
            await self.wipe.start()
        if self.keys is not None:
            self.known_keys.start(self.keys)
        if self.replayer is not None:
            await self.replayer.start()
        if self.reaper is not None:
            self.reaper.start()

    def register_metrics(self, metrics: Metrics) -> None:
        """Export the reaped reservations, the requests refused by rate limits and budgets, the journal's depth and
        the outage counters (read at scrape time)."""
        if self.reaper is not None:
            metrics.registry.register(_ReapedReservations(self.reaper))
        if self.counters is not None:
            metrics.registry.register(_LimitRefusals(self.limits_refused))
        journaled = self.journaled
        if journaled is None:
            return
        metrics.gauge_callback("ragproxy_credit_journal_depth", "Settlements waiting in the local journal for the "
                               "credit store", [], lambda: [({}, float(journaled.journal.depth))])
        metrics.registry.register(_OutageCounters(journaled))

    async def stop(self) -> None:
        """Wait for background settlements (each bounded by its retry window), then close the stores."""
        if self.settling:
            await asyncio.gather(*self.settling, return_exceptions=True)
        if self.reaper is not None:
            await self.reaper.stop()
        await self.known_keys.stop()
        if self.wipe is not None:
            await self.wipe.stop()
        if self.replayer is not None:
            await self.replayer.stop()
        if self.counters is not None:
            await self.counters.close()
        closed: set[int] = set()
        for resource in (self.store, self.keys, self.idempotency):
            if resource is not None and id(resource) not in closed:
                closed.add(id(resource))
                await resource.close()


class CreditsConfig(Protocol):
    """The settings the credit components are built from (:class:`proxy.assembly.config.Settings` is one)."""

    @property
    def credits(self) -> CreditsSettings: ...

    @property
    def auth(self) -> AuthSettings: ...

    @property
    def idempotency(self) -> IdempotencySettings: ...

    @property
    def redis(self) -> RedisSettings: ...

    @property
    def data_dir(self) -> Path: ...


def price_book(settings: CreditsConfig) -> PriceBook:
    credits = settings.credits
    return PriceBook(
        models={name: ModelPrice(p.prompt_per_1k, p.completion_per_1k, p.cached_prompt_per_1k)
                for name, p in credits.models.items()},
        default_price=ModelPrice(credits.default_prompt_per_1k, credits.default_completion_per_1k),
        limits={name: ModelLimits(p.context_tokens, p.max_completion_tokens) for name, p in credits.models.items()},
        search_price=credits.search_price,
        rerank_price=credits.rerank_price,
        request_price=credits.request_price,
        hit_multipliers=dict(credits.hit_multipliers),
        default_hit_multiplier=credits.default_hit_multiplier,
    )


def build_credits(settings: CreditsConfig) -> CreditComponents:
    """Stores are created only when something needs them (API keys, billing)."""
    needs_keys = settings.auth.mode == "keys" or settings.credits.enabled
    use_redis = settings.credits.store == "redis" or (settings.credits.store == "auto" and settings.redis.url)
    keys: KeyStore | None = None
    counters: LimitCounters | None = None
    store: CreditStore | None = None
    persistence_check: Callable[[], Awaitable[object]] | None = None
    wipe: WipeWatch | None = None
    if use_redis:
        if settings.redis.url is None:
            raise ValueError("credits.store is redis but redis.url is not set")
        from proxy.auth.redis_keys import RedisKeyStore
        from proxy.credits.redis_store import RedisCreditStore
        from proxy.stores.redis_wipe import WipeWatch

        reconnect_s = settings.redis.reconnect_s
        redis_keys = RedisKeyStore.from_url(settings.redis.url, cluster=settings.redis.cluster,
                                            reconnect_s=reconnect_s) if needs_keys else None
        keys = redis_keys
        redis_store: RedisCreditStore | None = None
        if settings.credits.enabled:
            from proxy.credits.persistence import check_persistence

            redis_store = store = RedisCreditStore.from_url(settings.redis.url, cluster=settings.redis.cluster,
                                                            reconnect_s=reconnect_s)
            persistence_check = functools.partial(check_persistence, redis_store.client,
                                                  allow_volatile=settings.credits.allow_volatile_redis)
        watched = redis_store or redis_keys
        if watched is not None:  # keys or credits in Redis: an empty Redis is not believed (nor are owners in it)
            wipe = WipeWatch(watched.client, key=f"{settings.redis.prefix}:sentinel",
                             interval_s=settings.redis.wipe_check_s)
            for part in (redis_store, redis_keys):
                if part is not None:
                    part.wipe = wipe
        if redis_keys is not None:
            from proxy.rate_limits.counters import RedisLimitCounters

            counters = redis_counters = RedisLimitCounters(redis_keys.client)
            redis_counters.wipe = wipe
    else:
        from proxy.auth.sqlite_keys import SqliteKeyStore
        from proxy.credits.sqlite_store import SqliteCreditStore

        path = settings.data_dir / "credits.sqlite3"
        if needs_keys or settings.credits.enabled:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        if needs_keys:
            keys = SqliteKeyStore(path)
            counters = LocalLimitCounters(path)
        if settings.credits.enabled:
            store = SqliteCreditStore(path, synchronous=settings.credits.sqlite_synchronous)
    reaper = ReservationReaper(store) if store is not None else None
    replayer: JournalReplayer | None = None
    if store is not None:
        journal = SettlementJournal(settings.data_dir / "credit-journal.sqlite3",
                                    synchronous=settings.credits.sqlite_synchronous)
        store = JournaledCreditStore(store, journal, OutageAllowance(to_micro(settings.credits.outage_allowance)))
        replayer = JournalReplayer(store, interval_s=settings.credits.journal_replay_interval_s)
    idempotency = idempotency_store(settings)
    if wipe is not None:
        from proxy.idempotency.redis_store import RedisIdempotencyStore

        if isinstance(idempotency, RedisIdempotencyStore):
            idempotency.wipe = wipe
    auth = settings.auth
    known = KnownKeys(ttl_s=auth.key_cache_ttl_s, sync_s=auth.key_sync_s, trust_s=auth.outage_key_trust_s)
    return CreditComponents(keys=keys, store=store, prices=price_book(settings), reaper=reaper, replayer=replayer,
                            known_keys=known, idempotency=idempotency, persistence_check=persistence_check, wipe=wipe,
                            counters=counters)


def idempotency_store(settings: CreditsConfig) -> IdempotencyStore | None:
    """Redis when ``redis.url`` is set (every replica sees every key), else this process's memory."""
    if not settings.idempotency.enabled:
        return None
    if settings.redis.url is not None:
        from proxy.idempotency.redis_store import RedisIdempotencyStore

        return RedisIdempotencyStore.from_url(settings.redis.url, cluster=settings.redis.cluster,
                                              per_user=settings.idempotency.max_entries_per_user,
                                              max_bytes=settings.idempotency.max_bytes,
                                              max_bytes_per_user=settings.idempotency.max_bytes_per_user,
                                              ttl_s=settings.idempotency.ttl_s,
                                              reconnect_s=settings.redis.reconnect_s)
    return MemoryIdempotencyStore(settings.idempotency.max_entries, settings.idempotency.max_entries_per_user,
                                  max_bytes=settings.idempotency.max_bytes,
                                  max_bytes_per_user=settings.idempotency.max_bytes_per_user)


class _ReapedReservations(Collector):
    """Reservations whose settlement never came (a dead proxy's), given back by the reaper."""

    def __init__(self, reaper: ReservationReaper) -> None:
        self.reaper = reaper

    def collect(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily("ragproxy_credit_reservations_reaped", "Expired reservations given back",
                                  value=self.reaper.reaped)


class _LimitRefusals(Collector):
    """Requests refused by a rate limit or a budget, by the limit (``requests``, ``tokens``, ``budget``)."""

    def __init__(self, refused: Counter[str]) -> None:
        self.refused = refused

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily("ragproxy_rate_limit_refusals", "Requests refused by a rate limit or a budget "
                                     "of their key, user or tenant", labels=["limit"])
        for limit in ("requests", "tokens", "budget"):
            family.add_metric([limit], self.refused[limit])
        yield family


class _OutageCounters(Collector):
    """Counters of the outage fallbacks, read from the journaled store at scrape time."""

    def __init__(self, store: JournaledCreditStore) -> None:
        self.store = store

    def collect(self) -> Iterable[CounterMetricFamily]:
        admissions = CounterMetricFamily("ragproxy_credit_outage_admissions", "Reservations the credit store "
                                         "could not take, by what the outage allowance decided", labels=["result"])
        admissions.add_metric(["admitted"], self.store.admitted)
        admissions.add_metric(["refused"], self.store.refused)
        journaled = CounterMetricFamily("ragproxy_credit_journal_settlements", "Settlements written to the "
                                        "local journal, and replayed into the credit store (with the store's "
                                        "outcome)", labels=["event", "outcome"])
        journaled.add_metric(["journaled", ""], self.store.journaled)
        for outcome, count in sorted(self.store.replayed.items()):
            journaled.add_metric(["replayed", outcome], count)
        yield admissions
        yield journaled
