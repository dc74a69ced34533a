"""The runtime's parts as the admin routes use them: the registered cache tiers, the credit stores, the KV layer."""

from __future__ import annotations

from typing import Any

from proxy.cache_tiers.search import SearchTier
from proxy.cache_tiers.semantic import SemanticCacheTier
from proxy.credits.keys import KeyStore
from proxy.credits.store import CreditStore
from proxy.runtime import Runtime
from tiers.invalidation import Invalidator
from tiers.response_tier import ResponseTier
from tiers.retrieval import RetrievalCache
from tiers.semantic import SemanticTier


def response_tiers(rt: Runtime) -> list[ResponseTier]:
    """The tiers of whole answers by exact key, fastest first."""
    return rt.tiers.answers


def semantic_tier(rt: Runtime) -> SemanticTier | None:
    tier = rt.tiers.find(SemanticCacheTier)
    return tier.semantic if tier is not None else None


def retrieval_cache(rt: Runtime) -> RetrievalCache | None:
    tier = rt.tiers.find(SearchTier)
    return tier.cache if tier is not None else None


def credit_store(rt: Runtime) -> CreditStore | None:
    return rt.credits.store


def key_store(rt: Runtime) -> KeyStore | None:
    return rt.credits.keys


def knowledge_summary(rt: Runtime) -> dict[str, Any] | None:
    """Per replica: the knowledge tree's size and the queue (``None`` without routing)."""
    return {"summary": rt.kv.summary()} if rt.kv is not None else None


def invalidator(rt: Runtime) -> Invalidator:
    """An :class:`Invalidator` over every registered tier (built per admin request: cheap)."""
    return rt.invalidator()
