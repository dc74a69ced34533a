"""API keys: who is behind a presented ``Authorization: Bearer`` key (a user, in a tenant).

A key is ``rpk_`` followed by 43 URL-safe characters from :func:`secrets.token_urlsafe` (256 random bits).
Only its SHA-256 is stored. A fast, unsalted hash is enough here, unlike for passwords: with 256 bits of
entropy a stolen hash table cannot be brute-forced or looked up in precomputed tables, and a fast hash lets
every request find its key with one indexed lookup (slow KDFs such as bcrypt or argon2 exist to stretch
low-entropy secrets and would cost milliseconds per request). Lookups compare hashes by index, so the timing
of a lookup reveals nothing usable about a key. The plaintext is returned once, by :meth:`KeyStore.create`;
the first characters (``display``) are kept so an operator can tell keys apart in a listing.

A key may expire (``expires_at``) and carry limits of its own (:class:`~proxy.core.handoffs.Limits`); users and
tenants carry limits too, kept in the same store (:meth:`KeyStore.set_scope_limits`). Every change to a key after
its creation (a revocation, new limits or expiry) and to a user's or tenant's limits is also written to the store's
change feed (:meth:`KeyStore.changes`): every replica reads it every ``auth.key_sync_s`` and applies it to the keys
it remembers (:mod:`proxy.auth.known_keys`), so a revoked key stops working everywhere within that time, and
stays refused by a replica that later loses the store.

Backends: :class:`proxy.auth.sqlite_keys.SqliteKeyStore` and
:class:`proxy.auth.redis_keys.RedisKeyStore`.
"""

from __future__ import annotations

import builtins
import hashlib
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from proxy.core.handoffs import NO_LIMITS, Limits, Quota, Scope

KEY_PREFIX = "rpk_"


def new_key() -> str:
    """A fresh random API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """A public identifier for a key (used in listings, revocation and the ledger)."""
    return "key_" + secrets.token_hex(8)


def key_hash(presented: str) -> str:
    """What the stores keep and look up: the hex SHA-256 of the key."""
    return hashlib.sha256(presented.encode()).hexdigest()


def display_of(key: str) -> str:
    """The first characters of a key, safe to show."""
    return key[: len(KEY_PREFIX) + 6] + "…"


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key's record (never its plaintext)."""

    key_id: str
    user: str
    tenant: str
    name: str
    display: str
    created_at: float
    revoked_at: float | None = None
    expires_at: float | None = None
    """When the key stops working (epoch seconds; ``None``: never)."""
    limits: Limits = NO_LIMITS
    """The key's own rate limits and budget (its user's and tenant's apply too)."""

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def usable(self, now: float) -> bool:
        """Not revoked, and not expired at ``now`` (epoch seconds)."""
        return self.active and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """A new key: its record and the plaintext, shown once."""

    record: ApiKey
    plaintext: str


@dataclass(frozen=True, slots=True)
class KeyChanges:
    """What changed in a key store after a position of its change feed (:meth:`KeyStore.changes`)."""

    seq: int
    """The feed's position after these changes (where the next read starts)."""
    keys: list[tuple[str, ApiKey]]
    """The keys changed, each with its hash (what a replica remembers it by), as they are now."""
    scopes: list[Scope] = field(default_factory=list)
    """The users and tenants whose limits changed, with their limits now."""


@runtime_checkable
class KeyStore(Protocol):
    """Where API keys live."""

    name: str

    async def create(self, user: str, tenant: str = "default", name: str = "", *, expires_at: float | None = None,
                     limits: Limits = NO_LIMITS) -> CreatedKey:
        """Issue a key for ``user`` in ``tenant``."""

    async def get(self, key_id: str) -> ApiKey | None:
        """The key ``key_id`` names (revoked ones too), or ``None``."""

    async def update(self, key_id: str, edit: Callable[[ApiKey], ApiKey]) -> ApiKey | None:
        """Change the active key ``key_id`` atomically to ``edit(key)`` (its ``name``, ``expires_at`` and ``limits``
        only; on the change feed): the key as changed, or ``None`` when there is no such active key. ``edit`` may
        raise :class:`ValueError` to refuse (nothing changes)."""

    async def list(
        self, *, user: str | None = None, tenant: str | None = None, include_revoked: bool = False
    ) -> list[ApiKey]:
        """Keys matching the filters, oldest first."""

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key; ``True`` if it was active."""

    async def lookup(self, presented: str) -> ApiKey | None:
        """The active key matching ``presented``, or ``None``."""

    async def scope_limits(self, kind: str, name: str) -> Limits:
        """The limits of a user or tenant (``kind``) named ``name`` (none set: no limits)."""

    async def set_scope_limits(self, kind: str, name: str, edit: Callable[[Limits], Limits]) -> Limits:
        """Change the limits of a user or tenant atomically to ``edit(limits)`` (on the change feed); the new
        limits. ``edit`` may raise :class:`ValueError` to refuse (nothing changes)."""

    async def limited_scopes(self) -> builtins.list[Scope]:
        """Every user and tenant with limits."""

    async def quota(self, key: ApiKey) -> Quota:
        """The limited scopes a request with ``key`` runs under: the key's own, its user's and its tenant's."""

    async def changes(self, since: int | None) -> KeyChanges:
        """The keys changed after position ``since`` of the change feed, in order, at most a page of them (read
        again from the returned ``seq`` until it stops moving); ``since=None``: the feed's position now, no keys."""

    async def close(self) -> None:
        """Release connections and threads."""


def quota_of(key: ApiKey, user: Limits, tenant: Limits) -> Quota:
    """The limited scopes a request with ``key`` runs under, given its user's and tenant's limits."""
    scopes = (Scope("key", key.key_id, key.limits), Scope("user", key.user, user), Scope("tenant", key.tenant, tenant))
    return Quota(tuple(scope for scope in scopes if scope.limits.limited))


def check_scope_kind(kind: str) -> str:
    """``kind`` if limits of it are kept apart from keys (``user``, ``tenant``), else :class:`ValueError`."""
    if kind not in ("user", "tenant"):
        raise ValueError(f"limits are set on users and tenants (and keys), not on {kind!r}")
    return kind


def matches(key: ApiKey, user: str | None, tenant: str | None, include_revoked: bool) -> bool:
    """Whether ``key`` passes the filters of :meth:`KeyStore.list`."""
    return (
        (user is None or key.user == user)
        and (tenant is None or key.tenant == tenant)
        and (include_revoked or key.active)
    )


# -- limits as stored with the keys --

def limits_json(limits: Limits) -> dict[str, Any]:
    """``limits`` as a JSON object of the limits it sets."""
    fields = {"rpm_limit": limits.rpm_limit, "tpm_limit": limits.tpm_limit, "max_budget": limits.max_budget,
              "budget_duration": limits.budget_duration}
    return {name: value for name, value in fields.items() if value is not None}


def limits_from(value: Any) -> Limits:
    """The limits stored as ``value`` (a JSON object; anything else: none)."""
    if not isinstance(value, Mapping):
        return Limits()

    def number(name: str) -> int | None:
        found = value.get(name)
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    duration = value.get("budget_duration")
    return Limits(number("rpm_limit"), number("tpm_limit"), number("max_budget"),
                  duration if isinstance(duration, str) else None)
