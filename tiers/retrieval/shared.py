"""Search-cache invalidation across replicas: each replica keeps its own cached searches, so an invalidation on one
(a write through the proxy, ``/admin/invalidate``, an ``X-Cache-Invalidate`` header) is broadcast on the
invalidation bus (message kind ``searches``) and applied by every replica before it returns.

A broadcast that fails (Redis down) is logged; the other replicas then keep their copies until the search cache's
TTL (``cache.retrieval.ttl_s``) ends them.
"""

from __future__ import annotations

import logging
from typing import Any

from tiers.invalidation_bus import BusUnavailable, InvalidationBus
from tiers.retrieval.cache import RetrievalCache
from tiers.retrieval.writes import WriteEffect, WriteScope, canonical_point_id

log = logging.getLogger("ragproxy.retrieval")
KIND = "searches"


def effect_message(effect: WriteEffect) -> dict[str, Any]:
    """The fields of a ``searches`` message."""
    return {"scope": effect.scope.value, "collection": effect.collection, "ids": sorted(effect.point_ids, key=str)}


def effect_of(message: dict[str, Any]) -> WriteEffect | None:
    """The effect a ``searches`` message carries, or ``None`` when it is not one."""
    try:
        scope = WriteScope(message["scope"])
        ids = frozenset(pid for pid in (canonical_point_id(v) for v in message.get("ids", ())) if pid is not None)
        return WriteEffect(scope, str(message.get("collection", "")), ids)
    except (KeyError, ValueError, TypeError):
        return None


def share_invalidations(cache: RetrievalCache, bus: InvalidationBus) -> None:
    """Broadcast ``cache``'s invalidations and apply every replica's (its own included: a repeat drops nothing)."""

    async def apply(message: dict[str, Any]) -> None:
        effect = effect_of(message)
        if effect is not None:
            await cache.invalidate(effect, announce=False)

    async def announce(effect: WriteEffect) -> None:
        try:
            await bus.broadcast(KIND, **effect_message(effect))
        except BusUnavailable as exc:
            log.warning("search invalidation not broadcast (other replicas keep their copies until the TTL): %s",
                        exc)

    bus.on(KIND, apply)
    cache.announce = announce
