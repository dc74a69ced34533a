"""From request to cache decisions: the per-request :class:`CachePolicy`, the bypass rule and the exact key.

Private (user-scoped) answers: in a namespace listed in ``cache.private_namespaces``, or for a request that
sends ``Cache-Control: private``, the key's scope is narrowed to the requesting user (``ctx.user``, the API key's
user; see :class:`~normalizer.canonical.KeyScope` for the key format). Everything keyed by the exact key follows
— L1, L3, coalescing, stale-if-error, per-item embeddings — and the semantic stage partitions by the same user
(``proxy.answers.semantic``). ``ctx.user_scope`` carries the user digest for later stages (a per-user backend
``cache_salt``, for one); it is set even when the request itself bypasses the cache. A client can only narrow its
own scope this way, never widen it. In open mode every caller is the same anonymous user, so user scoping needs
API keys to tell users apart.

Structured documents (``ragproxy.documents``, read by :class:`~proxy.core.prompt.ReadPrompt`) are part of the
exact key: the same question over other documents is another request. So are the query string and the configured
headers the upstream may answer by (``cache.key_headers``; :func:`~normalizer.canonical.request_variant`), set as
``ctx.key_variant`` for the semantic signature too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from normalizer.bypass import BypassSettings, bypass_reason
from normalizer.cache_control import CacheControlError, CacheDefaults, cache_policy
from normalizer.canonical import (
    DEFAULT_KEY_HEADERS,
    SHARED_TENANT,
    KeyScope,
    cache_key,
    keyed_request,
    request_variant,
    user_digest,
)
from normalizer.canonical_json import CanonicalizationError
from normalizer.documents import PromptDocuments
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import Endpoint
from proxy.core.errors import ProxyError
from proxy.core.outcome import CacheStatus, Outcome
from proxy.core.pipeline import Next
from tiers.versions import VersionSource

if TYPE_CHECKING:
    from proxy.answers.settings import CacheSettings


def asks_private(headers: Mapping[str, str]) -> bool:
    """Whether a ``Cache-Control`` request header carries the ``private`` directive (case-insensitive)."""
    getall = getattr(headers, "getall", None)
    values = getall("Cache-Control", ()) if getall is not None else [headers.get("Cache-Control", "")]
    return any(item.partition("=")[0].strip().lower() == "private"
               for value in values for item in value.split(","))


Lifetime = Callable[[Mapping[str, Any]], "float | None"]
"""The longest an answer to this body may be cached and served, whatever the request asks (``None``: no bound)."""


class ApplyCacheControl:
    """Headers and the proxy's own body objects (``cache``, ``ragproxy``) → ``ctx.cache_policy``, the namespace.

    ``lifetime`` bounds the policy's TTL and max age for answers that stop being valid upstream: a stored Responses
    object is kept upstream for ``upstreams.response_retention_s``, and its cached copy is neither kept nor served
    longer (it would hand out an id that names nothing any more)."""

    name = "cache_control"
    needs: frozenset[str] = frozenset()
    gives = frozenset({"cache_policy", "namespace"})
    live_keys = frozenset({"cache.l1.ttl_s"})

    def __init__(self, defaults: CacheDefaults, lifetime: Lifetime | None = None) -> None:
        self.defaults = defaults
        self.lifetime = lifetime

    def configure(self, cache: CacheSettings) -> None:
        self.defaults = replace(self.defaults, ttl=cache.l1.ttl_s)

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        try:
            policy = cache_policy(ctx.request.headers, ctx.proxy_fields, self.defaults)
        except CacheControlError as exc:
            raise ProxyError(400, str(exc), code="invalid_cache_control") from None
        limit = self.lifetime(ctx.body or {}) if self.lifetime is not None else None
        if limit is not None:
            policy = replace(policy, ttl=min(policy.ttl if policy.ttl is not None else limit, limit),
                             max_age=min(policy.max_age if policy.max_age is not None else limit, limit))
        ctx.cache_policy = policy
        ctx.namespace = policy.namespace
        return await call_next(ctx)


def _documents(prompt: PromptDocuments | None) -> list[dict[str, Any]] | None:
    """Structured documents as the key holds them (sent apart from the messages, so not in the canonical body)."""
    if prompt is None or prompt.structured is None:
        return None
    return [{"id": d.id, "title": d.title, "text": d.text} for d in prompt.documents]


class Canonicalize:
    """The bypass rule, then the exact key (scoped by tenant, namespace, knowledge version and — when private —
    user). An answer that is the tenant's own resource upstream (``owned``: a stored Responses object, whose id
    only its tenant may fetch or continue) is never keyed under the shared tenant of ``cache.shared_namespaces``."""

    name = "canonicalize"
    gives = frozenset({"user_scope", "key_scope", "key_variant", "cache_key", "bypass_reason", "outcome"})
    live_keys = frozenset({"cache.unknown_fields", "cache.cache_sampled", "cache.shared_namespaces"})

    def __init__(self, endpoint: Endpoint, bypass: BypassSettings, versions: VersionSource,
                 shared_namespaces: frozenset[str], private_namespaces: frozenset[str] = frozenset(),
                 key_headers: tuple[str, ...] = DEFAULT_KEY_HEADERS) -> None:
        """``endpoint``: its bypass rules, its canonicaliser, its kind, whether its answers are owned upstream, and
        whether its prompt documents (``ctx.prompt``) are part of its key."""
        self.endpoint = endpoint
        self.owned = endpoint.owned
        self.key_headers = key_headers
        self.needs = frozenset({"cache_policy", "prompt"} if endpoint.read_prompt else {"cache_policy"})
        self.bypass = bypass
        self.versions = versions
        self.shared = shared_namespaces
        self.private = private_namespaces

    def configure(self, cache: CacheSettings) -> None:
        self.bypass = replace(self.bypass, unknown_fields=cache.unknown_fields, cache_sampled=cache.cache_sampled)
        self.shared = frozenset(cache.shared_namespaces)

    def user_scope(self, ctx: RequestContext) -> str | None:
        """The user digest when this request's answers are user-scoped (also set as ``ctx.user_scope``)."""
        if ctx.user_scope is None and (ctx.namespace in self.private or asks_private(ctx.request.headers)):
            ctx.user_scope = user_digest(ctx.tenant, ctx.user)
        return ctx.user_scope

    def scope(self, ctx: RequestContext) -> KeyScope:
        """Where this request's keys live (also set as ``ctx.key_scope``); the version is read for the real (or
        shared) tenant, never per user."""
        shared = ctx.namespace in self.shared and not (self.owned is not None and self.owned(ctx.body or {}))
        tenant = SHARED_TENANT if shared else ctx.tenant
        version = self.versions.current(tenant, ctx.namespace)
        scope = ctx.key_scope = KeyScope(tenant, ctx.namespace, version, self.user_scope(ctx) or "")
        return scope

    def variant(self, ctx: RequestContext) -> Any:
        """The request's variant (also set as ``ctx.key_variant``)."""
        variant = ctx.key_variant = request_variant(ctx.request.query_string, ctx.request.headers, self.key_headers)
        return variant

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        self.user_scope(ctx)  # set for later stages even when this request is not cached
        policy = ctx.cache_policy
        if policy is None or not (policy.may_read or policy.may_store):
            ctx.outcome = Outcome(CacheStatus.BYPASS)
            return await call_next(ctx)
        endpoint = self.endpoint
        reason = bypass_reason(ctx.body, self.bypass, rules=endpoint.rules, namespace=ctx.namespace)
        if reason is None and endpoint.canonical is not None:
            try:
                canonical = endpoint.canonical(ctx.body or {})
                keyed = keyed_request(canonical, documents=_documents(ctx.prompt), variant=self.variant(ctx))
                ctx.cache_key = cache_key(endpoint.kind, keyed, self.scope(ctx))
            except CanonicalizationError as exc:
                reason = f"not canonicalizable: {exc}"
        if reason is not None:
            ctx.bypass_reason = reason
            ctx.outcome = Outcome(CacheStatus.BYPASS)
        return await call_next(ctx)
