"""Which Qdrant collections a tenant reaches, and under which upstream names. Pure: no I/O.

Two ways in, both at once:

* **its own namespace** (transparent): every collection (and alias) a tenant names is kept upstream as
  ``ragproxy_t_<token>_<name>``, ``<token>`` the first 16 hex digits of the BLAKE2b digest of the tenant. The proxy
  maps each name on the way in (the path, and every body field that names a collection: :mod:`proxy.search.bodies`)
  and back on the way out (listings, error messages: :mod:`proxy.search.answers`), so a client sees its own names
  only, two tenants may both have a ``docs``, and neither can name the other's: whatever it sends lands in its own
  namespace. A tenant has every right on its own collections.
* **the operator's grants** (``upstreams.qdrant.collections``): collections made outside the proxy, reached by the
  tenants named there under their upstream names, to read or to read and write points; creating, changing,
  aliasing or deleting them stays the operator's. A granted name wins over the same name in the tenant's namespace.

Nothing else upstream is reachable: a collection made outside the proxy and not granted is, for a tenant, just a
name its namespace does not hold.

The one exception is the anonymous tenant of ``auth.mode: open`` (no key presented, or one the proxy does not
know): with ``upstreams.qdrant.anonymous: upstream`` (the default) it reaches Qdrant's collections under their own
names, with every right — as before the proxy stood in front — except the proxy's own, whose names start with
``ragproxy_`` (the namespaces and the shared semantic index): it can neither name nor list them. Open mode has no
keys to tell callers apart, so there is nothing to isolate among them; what it must not reach is the keyed tenants'
data. ``anonymous: namespace`` gives it a namespace like any tenant.

Users of a tenant share its collections, as they share its cache (a user can read every point of them anyway); a
private cache namespace does not change that. Where users must not see each other's vectors, give each a tenant.

The names are computed, not stored: the proxy keeps no per-tenant state here beyond the namespaces of the last 4,096
tenants seen (a bounded cache of a digest).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proxy.core.errors import ProxyError
from proxy.search.routes import MAX_NAME_CHARS, Access
from proxy.upstream.settings import PROXY_COLLECTIONS, CollectionGrant, QdrantUpstream

EVERY_TENANT = "*"
_TOKEN_HEX = 16
_NAMESPACE = f"{PROXY_COLLECTIONS}t_"


@functools.lru_cache(maxsize=4096)
def namespace_of(tenant: str) -> str:
    """The start of every upstream name of ``tenant``'s collections (the last 4,096 tenants' remembered: a digest
    per request is work the hot path need not do)."""
    token = hashlib.blake2b(tenant.encode("utf-8", "surrogatepass"), digest_size=_TOKEN_HEX // 2).hexdigest()
    return f"{_NAMESPACE}{token}_"


def _refused(message: str) -> ProxyError:
    return ProxyError(403, f"Forbidden: {message}", code="forbidden")


@dataclass(frozen=True, slots=True)
class TenantView:
    """The collections one request's tenant reaches: its names mapped to upstream names and back."""

    namespace: str | None
    """The tenant's namespace prefix; ``None``: Qdrant's own names (the anonymous tenant of an open proxy)."""
    granted: Mapping[str, Access]
    """Upstream collections granted to the tenant, with the most it may do there."""

    def upstream(self, name: str, need: Access) -> str:
        """The upstream name of the collection the tenant calls ``name`` (already a valid name), if it may do
        ``need`` there; else 403, or 400 for a name too long to fit its namespace."""
        if self.namespace is None:
            if name.startswith(PROXY_COLLECTIONS):
                raise _refused(f"collection names starting with {PROXY_COLLECTIONS} are the proxy's own")
            return name
        level = self.granted.get(name)
        if level is not None:
            if need > level:
                what = "changed" if need is Access.WRITE else "managed"
                raise _refused(f"collection `{name}` is shared with this key to {_verb(level)}; it cannot be {what} "
                               "through the proxy")
            return name
        room = MAX_NAME_CHARS - len(self.namespace)
        if len(name) > room:
            raise ProxyError(400, f"Bad request: collection names through this proxy have at most {room} characters",
                             code="bad_request")
        return self.namespace + name

    def client_name(self, upstream: str) -> str | None:
        """The name the tenant knows an upstream collection by; ``None`` when it does not reach it."""
        if self.namespace is None:
            return None if upstream.startswith(PROXY_COLLECTIONS) else upstream
        if upstream.startswith(self.namespace):
            return upstream[len(self.namespace):]
        return upstream if upstream in self.granted else None

    def scrub(self, text: bytes) -> bytes:
        """``text`` (an error message from Qdrant) with the tenant's namespace taken out of every name in it, so that
        the tenant reads its names as it gave them. No other tenant's namespace can be in it but one the tenant
        wrote into a name itself: the proxy sends Qdrant no other."""
        return text if self.namespace is None else text.replace(self.namespace.encode(), b"")

    def visible(self, upstream_names: Iterable[str]) -> list[str]:
        """The tenant's names of those upstream collections it reaches, each once (a granted name hides the same
        name of its namespace), in the upstream's order."""
        seen: dict[str, None] = {}
        for upstream in upstream_names:
            name = self.client_name(upstream)
            if name is not None:
                seen.setdefault(name)
        return list(seen)


def _verb(level: Access) -> str:
    return "read" if level is Access.READ else "read and write"


class CollectionAccess:
    """The operator's configuration of who reaches which collection (``upstreams.qdrant``): each request's
    :class:`TenantView`."""

    def __init__(self, grants: Mapping[str, CollectionGrant], *, anonymous_upstream: bool) -> None:
        self.anonymous_upstream = anonymous_upstream
        self._grants: dict[str, dict[str, Access]] = {}  # tenant (or "*") → collection → level
        for collection, grant in grants.items():
            for tenant in grant.read:
                self._grants.setdefault(tenant, {}).setdefault(collection, Access.READ)
            for tenant in grant.write:
                self._grants.setdefault(tenant, {})[collection] = Access.WRITE

    @classmethod
    def from_settings(cls, qdrant: QdrantUpstream) -> CollectionAccess:
        return cls(qdrant.collections, anonymous_upstream=qdrant.anonymous == "upstream")

    def view(self, tenant: str, *, identified: bool) -> TenantView:
        """What ``tenant`` reaches; ``identified``: it presented a key the proxy knows (else it is the anonymous
        tenant of an open proxy)."""
        if not identified and self.anonymous_upstream:
            return TenantView(None, {})
        granted = dict(self._grants.get(EVERY_TENANT, {}))
        for collection, level in self._grants.get(tenant, {}).items():
            granted[collection] = max(level, granted.get(collection, level))
        return TenantView(namespace_of(tenant), granted)

