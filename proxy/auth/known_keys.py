"""The API keys one replica verified lately, kept true by the key store's change feed.

The identify stage (:class:`~proxy.auth.identify.Identify`) looks a presented key up in the key store at most once
every ``auth.key_cache_ttl_s`` and remembers it here meanwhile (at most ``size`` keys; the map is emptied when
full). Two things keep what is remembered true:

- **The change feed** (:meth:`proxy.auth.keys.KeyStore.changes`), read every ``auth.key_sync_s``: a key changed
  in the store (revoked, expiring, limited) is replaced here by its new record at once, and so are the limits of a
  user or tenant, so a revocation or a new limit reaches every replica within ``key_sync_s``, not
  ``key_cache_ttl_s``, and a revoked key stays refused by a replica that later loses the store.
- **A bound on trust in an outage**: when the store cannot answer, a remembered key is used past its cache age only
  while its record was confirmed (looked up, or covered by a read of the feed) within ``auth.outage_key_trust_s``;
  past it, the request is refused with 503.

So through an outage of the key store (Redis stopped, or wiped: :mod:`proxy.stores.redis_wipe`) a key revoked
before it stays refused, the keys known good keep working for ``outage_key_trust_s``, and nothing else is let in.
What a replica cannot know is a revocation made while it cannot reach the store (another replica may): it learns it
as soon as it reads the feed again, and meanwhile it trusts no key longer than ``outage_key_trust_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy.auth.keys import ApiKey, KeyStore, quota_of
from proxy.auth.settings import AuthSettings
from proxy.core.handoffs import Limits, Quota, Scope
from proxy.stores.unavailable import StoreUnavailable
from tiers.background import stop_task

_AUTH = AuthSettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.credits")


@dataclass(slots=True)
class KnownKey:
    """A key as this replica knows it: its record, its user's and tenant's limits, until when it is used without a
    lookup, when it was confirmed; and ``quota``, the limited scopes its requests run under (``None``: none), kept
    up to date by :meth:`change`."""

    key: ApiKey
    user_limits: Limits
    tenant_limits: Limits
    fresh_until: float
    confirmed_at: float
    quota: Quota | None = None

    def __post_init__(self) -> None:
        self.change()

    def change(self, *, key: ApiKey | None = None, user: Limits | None = None, tenant: Limits | None = None) -> None:
        """A new record or new limits of its user or tenant (from the change feed)."""
        self.key = key or self.key
        self.user_limits = user or self.user_limits
        self.tenant_limits = tenant or self.tenant_limits
        quota = quota_of(self.key, self.user_limits, self.tenant_limits)
        self.quota = quota if quota.scopes else None


class KnownKeys:
    """Keys verified lately, by hash (see the module docstring); ``clock`` is monotonic."""

    def __init__(self, *, ttl_s: float = _AUTH.key_cache_ttl_s, size: int = 10_000,
                 sync_s: float = _AUTH.key_sync_s, trust_s: float = _AUTH.outage_key_trust_s,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self.sync_s = sync_s
        self.trust_s = trust_s
        self.clock = clock
        self.synced_at = float("-inf")
        """When the feed was last read to its end: every change made before then is applied."""
        self.seq: int | None = None
        """The feed's position read up to (``None``: not read yet)."""
        self._known: dict[str, KnownKey] = {}
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._known)

    def fresh(self, digest: str) -> KnownKey | None:
        """The key remembered under ``digest`` while it needs no lookup."""
        known = self._known.get(digest)
        return known if known is not None and known.fresh_until > self.clock() else None

    def trusted(self, digest: str) -> KnownKey | None:
        """The key remembered under ``digest``, whatever its age, while it may stand in for a lookup the store
        cannot answer: confirmed within ``trust_s``."""
        known = self._known.get(digest)
        if known is None or max(known.confirmed_at, self.synced_at) + self.trust_s <= self.clock():
            return None
        return known

    def remember(self, digest: str, key: ApiKey, quota: Quota | None = None) -> KnownKey:
        """``key``, just looked up, with the limited scopes its requests run under (``None``: no limits)."""
        if len(self._known) >= self.size and digest not in self._known:
            self._known.clear()
        now = self.clock()
        limits = {scope.kind: scope.limits for scope in (quota.scopes if quota is not None else ())}
        known = self._known[digest] = KnownKey(key, limits.get("user", Limits()), limits.get("tenant", Limits()),
                                               now + self.ttl_s, now)
        return known

    def forget(self, digest: str) -> None:
        self._known.pop(digest, None)

    # -- the change feed --

    async def sync(self, keys: KeyStore) -> None:
        """Read the feed to its end and apply it (:class:`StoreUnavailable` when the store cannot answer)."""
        started = self.clock()
        if self.seq is None:
            self.seq = (await keys.changes(None)).seq
        while True:
            changes = await keys.changes(self.seq)
            if changes.seq < self.seq:  # the feed went back (its data went): nothing remembered is confirmed
                log.warning("the key store's change feed went back from %d to %d: every remembered key is looked "
                            "up again", self.seq, changes.seq)
                self._known.clear()
                self.seq = changes.seq
                break
            for digest, key in changes.keys:
                known = self._known.get(digest)
                if known is not None:
                    known.change(key=key)
            for scope in changes.scopes:
                self.scope_changed(scope)
            if changes.seq == self.seq:
                break
            self.seq = changes.seq
        self.synced_at = started

    def key_changed(self, key: ApiKey) -> None:
        """``key`` as it is now (revoked, or its expiry or limits changed), wherever it is remembered: the admin API
        tells this replica at once; the others learn it from the feed."""
        for known in self._known.values():
            if known.key.key_id == key.key_id:
                known.change(key=key)

    def scope_changed(self, scope: Scope) -> None:
        """A user's or tenant's new limits, on every remembered key of theirs."""
        for known in self._known.values():
            if scope.kind == "user" and known.key.user == scope.name:
                known.change(user=scope.limits)
            elif scope.kind == "tenant" and known.key.tenant == scope.name:
                known.change(tenant=scope.limits)

    async def _follow(self, keys: KeyStore) -> None:
        while True:
            try:
                await self.sync(keys)
            except StoreUnavailable as exc:
                log.debug("key changes not read: %s", exc)
            except Exception:  # a bug must not stop revocations from being applied for good
                log.exception("reading the key change feed failed")
            await asyncio.sleep(self.sync_s)

    def start(self, keys: KeyStore) -> None:
        """Follow ``keys``'s change feed every ``sync_s`` until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow(keys), name="key-change-feed")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
