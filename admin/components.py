"""The runtime's parts as the admin routes use them: the registered cache tiers, the credit stores, the KV layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from proxy.cache_tiers.base import TierSet
from proxy.credits.keys import KeyStore
from proxy.credits.store import CreditStore
from proxy.runtime import Runtime
from tiers.invalidation import InvalidSelector, Outcome, Selector
from tiers.response_tier import ResponseTier


def response_tiers(rt: Runtime) -> list[ResponseTier]:
    """The tiers of whole answers by exact key, fastest first."""
    return rt.tiers.answers


def credit_store(rt: Runtime) -> CreditStore | None:
    return rt.credits.store


def key_store(rt: Runtime) -> KeyStore | None:
    return rt.credits.keys


def knowledge_summary(rt: Runtime) -> dict[str, Any] | None:
    """Per replica: the knowledge tree's size and the queue (``None`` without routing)."""
    return {"summary": rt.kv.summary()} if rt.kv is not None else None


class TierInvalidation:
    """Invalidations and flushes over every registered tier, in registration order (each tier drops its own part:
    :meth:`proxy.cache_tiers.base.CacheTier.invalidate`, ``flush``); ``on_removed`` is told every answer key that
    went."""

    def __init__(self, tiers: TierSet, on_removed: Callable[[list[str]], None]) -> None:
        self.tiers = tiers
        self.on_removed = on_removed

    async def invalidate(self, selector: Selector) -> Outcome:
        embedder = next((tier.embedder for tier in self.tiers if tier.embedder is not None), None)
        if selector.near is not None and embedder is None:
            raise InvalidSelector("a semantic radius needs the semantic tier, which this proxy does not run")
        removed = Outcome()
        if selector.empty:
            return removed
        for tier in self.tiers:
            await tier.invalidate(selector, embedder, removed)
        return self._told(removed)

    async def delete_keys(self, keys: Sequence[str]) -> Outcome:
        """Remove these keys from every tier."""
        return await self.invalidate(Selector(keys=tuple(keys)))

    async def flush(self, names: Sequence[str] | None = None) -> Outcome:
        """Empty the named tiers (every flushable one when ``None``)."""
        known = {tier.name for tier in self.tiers if tier.flushable}
        wanted = known if names is None else set(names)
        unknown = sorted(wanted - known)
        if unknown:
            raise InvalidSelector(f"unknown tier(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        removed = Outcome()
        for tier in self.tiers:
            if tier.name in wanted or not tier.flushable:
                await tier.flush(removed)
        return self._told(removed)

    def _told(self, removed: Outcome) -> Outcome:
        if removed.keys:
            self.on_removed(removed.keys)
        return removed


def invalidator(rt: Runtime) -> TierInvalidation:
    """Invalidation over every registered tier (built per admin request: cheap)."""
    return TierInvalidation(rt.tiers, rt.stats.forget)
