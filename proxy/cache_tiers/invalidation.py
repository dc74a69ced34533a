"""Invalidations and flushes over every registered cache tier, in registration order."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.cache_tiers.base import TierSet
from tiers.invalidation import InvalidSelector, Removal, Selector


class TierInvalidation:
    """Invalidations and flushes over every registered tier, in registration order (each tier drops its own part:
    :meth:`proxy.core.cache_tier.CacheTier.invalidate`, ``flush``); ``on_removed`` is told every answer key
    that
    went."""

    def __init__(self, tiers: TierSet, on_removed: Callable[[list[str]], None]) -> None:
        self.tiers = tiers
        self.on_removed = on_removed

    async def invalidate(self, selector: Selector) -> Removal:
        embedder = next((tier.embedder for tier in self.tiers if tier.embedder is not None), None)
        if selector.near is not None and embedder is None:
            raise InvalidSelector("a semantic radius needs the semantic tier, which this proxy does not run")
        removed = Removal()
        if selector.empty:
            return removed
        for tier in self.tiers:
            await tier.invalidate(selector, embedder, removed)
        return self._told(removed)

    async def delete_keys(self, keys: Sequence[str]) -> Removal:
        """Remove these keys from every tier."""
        return await self.invalidate(Selector(keys=tuple(keys)))

    async def flush(self, names: Sequence[str] | None = None) -> Removal:
        """Empty the named tiers (every flushable one when ``None``).

        The outcome names only what was flushed: emptying one answer tier leaves the tiers that are not flushed by
        name alone (the semantic index's vectors still point at answers the other tiers hold; one whose answer is
        gone everywhere is dropped when it is next matched); only a flush of everything runs them too."""
        known = {tier.name for tier in self.tiers if tier.flushable}
        wanted = known if names is None else set(names)
        unknown = sorted(wanted - known)
        if unknown:
            raise InvalidSelector(f"unknown tier(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        removed = Removal()
        for tier in self.tiers:
            if tier.name in wanted or (names is None and not tier.flushable):
                await tier.flush(removed)
        return self._told(removed)

    def _told(self, removed: Removal) -> Removal:
        if removed.keys:
            self.on_removed(removed.keys)
        return removed
