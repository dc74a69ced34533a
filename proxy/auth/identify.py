"""The identify stage of the pipeline: who pays for a request.

``Identify`` reads ``Authorization: Bearer <key>`` (or Qdrant's ``api-key`` header) and puts the key's user,
tenant and id on the context. In open mode every request that presents no valid key runs as the anonymous user
(the OpenAI SDK always sends some key, so an unknown key is not an error there). Lookups of valid keys are
remembered for ``key_cache_ttl_s`` seconds and kept true by the key store's change feed
(:mod:`proxy.auth.known_keys`): a revoked key stops working within ``key_sync_s``, also through a later outage
of the key store, which known keys ride out for ``outage_key_trust_s``; any other outage answers 503 +
``Retry-After`` (authentication never fails open).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from multidict import CIMultiDictProxy

from proxy.auth.keys import KeyStore, key_hash
from proxy.auth.known_keys import KnownKey, KnownKeys
from proxy.core.context import Handoff, Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.handoffs import Quota
from proxy.core.pipeline import Named, Next
from proxy.stores.unavailable import StoreUnavailable, store_unavailable

log = logging.getLogger("ragproxy.credits")


def presented_key(headers: CIMultiDictProxy[str]) -> str | None:
    """The API key a request presents: ``Authorization: Bearer …`` or Qdrant's ``api-key``."""
    auth = headers.get("Authorization", "")
    scheme, _, token = auth.strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    api_key = headers.get("api-key", "").strip()
    return api_key or None


QUOTA: Handoff[Quota] = Handoff("quota")
"""The limits of the request's key, user and tenant (``None``: none apply); read by rate_limits."""


class Identify:
    """API key → user, tenant and their limits on the context; 401 without a valid key (unknown, revoked or
    expired) unless in open mode."""

    name = "identify"
    needs: frozenset[str] = frozenset()
    gives: frozenset[Named] = frozenset({"tenant", "user", "api_key_id", QUOTA})

    def __init__(
        self,
        keys: KeyStore | None,
        *,
        open_mode: bool = False,
        retry_after_s: int = 5,
        known: KnownKeys | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``known``: the verified keys remembered (kept by the runtime, which follows the key store's change feed
        into it, so a rebuilt stage keeps them); ``wall_clock``: what keys expire by (epoch seconds)."""
        if keys is None and not open_mode:
            raise ValueError("without a key store only open mode can identify anyone")
        self.keys = keys
        self.open_mode = open_mode
        self.retry_after_s = retry_after_s
        self.known = known if known is not None else KnownKeys()
        self.wall_clock = wall_clock

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        presented = presented_key(ctx.request.headers)
        known = await self._lookup(presented) if presented and self.keys is not None else None
        if known is not None and known.key.usable(self.wall_clock()):
            key = known.key
            ctx.user, ctx.tenant, ctx.api_key_id = key.user, key.tenant, key.key_id
            if known.quota is not None:
                ctx.handoffs[QUOTA] = known.quota
        elif not self.open_mode:
            if presented is None:
                raise ProxyError(
                    401,
                    "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                    code="missing_api_key",
                )
            raise ProxyError(401, "Incorrect API key provided.", code="invalid_api_key")
        return await call_next(ctx)

    async def _lookup(self, presented: str) -> KnownKey | None:
        """The key ``presented`` names as this replica knows it (revoked or expired ones too, when it knows them
        so), or ``None``."""
        assert self.keys is not None
        digest = key_hash(presented)
        known = self.known.fresh(digest)
        if known is not None:
            return known
        try:
            key = await self.keys.lookup(presented)
            quota = await self.keys.quota(key) if key is not None else None
        except StoreUnavailable as exc:
            known = self.known.trusted(digest)  # known a moment ago: ride out the outage
            if known is None and not self.open_mode:
                raise store_unavailable("the API key store", self.retry_after_s) from exc
            if known is None:
                log.warning("key store unavailable, serving as anonymous: %s", exc)
            return known
        if key is None:
            self.known.forget(digest)
            return None
        return self.known.remember(digest, key, quota)
