"""From request to cache decisions: the per-request :class:`CachePolicy`, the bypass rule and the exact key.

Private (user-scoped) answers: in a namespace listed in ``cache.private_namespaces``, or for a request that
sends ``Cache-Control: private``, the key's scope is narrowed to the requesting user (``ctx.user``, the API key's
user; see :class:`~normalizer.canonical.KeyScope` for the key format). Everything keyed by the exact key follows
— L1, L3, coalescing, stale-if-error, per-item embeddings — and the semantic stage partitions by the same user
(``proxy.stages.semantic``). :data:`USER_SCOPE` in ``ctx.state`` carries the user digest for later stages (a
per-user backend ``cache_salt``, for one); it is set even when the request itself bypasses the cache. A client can
only narrow its own scope this way, never widen it. In open mode every caller is the same anonymous user, so
user scoping needs API keys to tell users apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from normalizer.bypass import BypassSettings, bypass_reason
from normalizer.cache_control import CacheControlError, CacheDefaults, cache_policy, strip_proxy_fields
from normalizer.canonical import SHARED_TENANT, KeyScope, RequestKind, cache_key, canonical_request, user_digest
from normalizer.canonical_json import CanonicalizationError
from proxy.context import Reply, RequestContext
from proxy.errors import ProxyError
from proxy.pipeline import Next
from tiers.versions import VersionSource

PRIVATE_REQUEST = "private_request"
"""``ctx.state`` flag: the request asked for a user-scoped answer (``Cache-Control: private``)."""
USER_SCOPE = "user_scope"
"""``ctx.state`` key: the :func:`~normalizer.canonical.user_digest` of a user-scoped request (absent otherwise)."""


def asks_private(headers: Mapping[str, str]) -> bool:
    """Whether a ``Cache-Control`` request header carries the ``private`` directive (case-insensitive)."""
    getall = getattr(headers, "getall", None)
    values = getall("Cache-Control", ()) if getall is not None else [headers.get("Cache-Control", "")]
    return any(item.partition("=")[0].strip().lower() == "private"
               for value in values for item in value.split(","))


class ApplyCacheControl:
    """Headers and the body's ``cache``/``ragproxy`` objects → ``ctx.state["cache_policy"]``; proxy fields stripped."""

    name = "cache_control"

    def __init__(self, defaults: CacheDefaults) -> None:
        self.defaults = defaults

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        try:
            policy = cache_policy(ctx.request.headers, ctx.body, self.defaults)
        except CacheControlError as exc:
            raise ProxyError(400, str(exc), code="invalid_cache_control") from None
        ctx.state["cache_policy"] = policy
        ctx.namespace = policy.namespace
        if asks_private(ctx.request.headers):
            ctx.state[PRIVATE_REQUEST] = True
        if ctx.body is not None:
            proxy_fields = ctx.body.get("ragproxy")
            if isinstance(proxy_fields, dict):
                ctx.state["ragproxy"] = proxy_fields
            stripped = strip_proxy_fields(ctx.body)
            if stripped is not ctx.body:
                ctx.replace_body(stripped)
        return await call_next(ctx)


class Canonicalize:
    """The bypass rule, then the exact key (scoped by tenant, namespace, knowledge version and — when private —
    user)."""

    name = "canonicalize"

    def __init__(self, kind: RequestKind, bypass: BypassSettings, versions: VersionSource,
                 shared_namespaces: frozenset[str], private_namespaces: frozenset[str] = frozenset()) -> None:
        self.kind = kind
        self.bypass = bypass
        self.versions = versions
        self.shared = shared_namespaces
        self.private = private_namespaces

    def user_scope(self, ctx: RequestContext) -> str | None:
        """The user digest when this request's answers are user-scoped (also recorded in ``ctx.state``)."""
        if ctx.namespace not in self.private and not ctx.state.get(PRIVATE_REQUEST):
            return None
        digest = ctx.state.get(USER_SCOPE)
        if digest is None:
            digest = ctx.state[USER_SCOPE] = user_digest(ctx.tenant, ctx.user)
        return str(digest)

    def scope(self, ctx: RequestContext) -> KeyScope:
        """Where this request's keys live; the version is read for the real (or shared) tenant, never per user."""
        tenant = SHARED_TENANT if ctx.namespace in self.shared else ctx.tenant
        version = self.versions.current(tenant, ctx.namespace)
        return KeyScope(tenant, ctx.namespace, version, self.user_scope(ctx) or "")

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        self.user_scope(ctx)  # recorded for later stages even when this request is not cached
        policy = ctx.state.get("cache_policy")
        if policy is None or not (policy.may_read or policy.may_store):
            ctx.cache_status = "BYPASS"
            return await call_next(ctx)
        reason = bypass_reason(ctx.body, self.bypass, kind=self.kind, namespace=ctx.namespace)
        if reason is None:
            try:
                canonical: Any = canonical_request(self.kind, ctx.body or {})[0]
            except CanonicalizationError as exc:
                reason = f"not canonicalizable: {exc}"
        if reason is not None:
            ctx.state["bypass"] = reason
            ctx.cache_status = "BYPASS"
            return await call_next(ctx)
        documents = (ctx.state.get("ragproxy") or {}).get("documents")
        if documents is not None:
            canonical = {"request": canonical, "documents": documents}
        scope = self.scope(ctx)
        ctx.state["scope"] = scope
        ctx.state["key"] = cache_key(self.kind, canonical, scope)
        return await call_next(ctx)
