"""Building the credit components from the settings: key store, credit store, price book, reaper.

Embedded mode keeps keys and the ledger in one SQLite file under ``data_dir``; shared mode (``redis.url`` set)
keeps them in Redis so every replica sees the same balances.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config import Settings
from proxy.credits.keys import KeyStore
from proxy.credits.pricing import ModelLimits, ModelPrice, PriceBook
from proxy.credits.reaper import ReservationReaper
from proxy.credits.store import CreditStore


@dataclass
class CreditComponents:
    """Everything identification and billing need; stores are ``None`` when not configured."""

    keys: KeyStore | None
    store: CreditStore | None
    prices: PriceBook
    reaper: ReservationReaper | None

    async def close(self) -> None:
        if self.reaper is not None:
            await self.reaper.stop()
        closed: set[int] = set()
        for resource in (self.store, self.keys):
            if resource is not None and id(resource) not in closed:
                closed.add(id(resource))
                await resource.close()


def price_book(settings: Settings) -> PriceBook:
    credits = settings.credits
    return PriceBook(
        models={name: ModelPrice(p.prompt_per_1k, p.completion_per_1k, p.cached_prompt_per_1k)
                for name, p in credits.models.items()},
        default_price=ModelPrice(credits.default_prompt_per_1k, credits.default_completion_per_1k),
        limits={name: ModelLimits(p.context_tokens, p.max_completion_tokens) for name, p in credits.models.items()},
        search_price=credits.search_price,
        hit_multipliers=dict(credits.hit_multipliers),
    )


def build_credits(settings: Settings) -> CreditComponents:
    """Stores are created only when something needs them (API keys, billing)."""
    needs_keys = settings.auth.mode == "keys" or settings.credits.enabled
    use_redis = settings.credits.store == "redis" or (settings.credits.store == "auto" and settings.redis.url)
    keys: KeyStore | None = None
    store: CreditStore | None = None
    if use_redis:
        if settings.redis.url is None:
            raise ValueError("credits.store is redis but redis.url is not set")
        from proxy.credits.redis_keys import RedisKeyStore
        from proxy.credits.redis_store import RedisCreditStore

        if needs_keys:
            keys = RedisKeyStore.from_url(settings.redis.url, cluster=settings.redis.cluster)
        if settings.credits.enabled:
            store = RedisCreditStore.from_url(settings.redis.url, cluster=settings.redis.cluster)
    else:
        from proxy.credits.sqlite_keys import SqliteKeyStore
        from proxy.credits.sqlite_store import SqliteCreditStore

        path = settings.data_dir / "credits.sqlite3"
        if needs_keys or settings.credits.enabled:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        if needs_keys:
            keys = SqliteKeyStore(path)
        if settings.credits.enabled:
            store = SqliteCreditStore(path, synchronous=settings.credits.sqlite_synchronous)
    reaper = ReservationReaper(store) if store is not None else None
    return CreditComponents(keys=keys, store=store, prices=price_book(settings), reaper=reaper)
