"""From request to cache decisions: the per-request :class:`CachePolicy`, the bypass rule and the exact key."""

from __future__ import annotations

from typing import Any

from normalizer.bypass import BypassSettings, bypass_reason
from normalizer.cache_control import CacheControlError, CacheDefaults, cache_policy, strip_proxy_fields
from normalizer.canonical import SHARED_TENANT, KeyScope, RequestKind, cache_key, canonical_request
from normalizer.canonical_json import CanonicalizationError
from proxy.context import Reply, RequestContext
from proxy.errors import ProxyError
from proxy.pipeline import Next
from tiers.versions import VersionSource


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
        if ctx.body is not None:
            proxy_fields = ctx.body.get("ragproxy")
            if isinstance(proxy_fields, dict):
                ctx.state["ragproxy"] = proxy_fields
            stripped = strip_proxy_fields(ctx.body)
            if stripped is not ctx.body:
                ctx.replace_body(stripped)
        return await call_next(ctx)


class Canonicalize:
    """The bypass rule, then the exact key (scoped by tenant, namespace and knowledge version)."""

    name = "canonicalize"

    def __init__(self, kind: RequestKind, bypass: BypassSettings, versions: VersionSource,
                 shared_namespaces: frozenset[str]) -> None:
        self.kind = kind
        self.bypass = bypass
        self.versions = versions
        self.shared = shared_namespaces

    def scope(self, ctx: RequestContext) -> KeyScope:
        tenant = SHARED_TENANT if ctx.namespace in self.shared else ctx.tenant
        return KeyScope(tenant, ctx.namespace, self.versions.current(tenant, ctx.namespace))

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
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
