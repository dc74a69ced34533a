"""The runtime's parts as the admin routes use them: the registered cache tiers, the credit stores, the KV layer."""

from __future__ import annotations

from typing import Any

from proxy.assembly.runtime import Runtime
from proxy.auth.keys import KeyStore
from proxy.cache_tiers.invalidation import TierInvalidation
from proxy.credits.store import CreditStore
from tiers.response_tier import ResponseTier


def response_tiers(rt: Runtime) -> list[ResponseTier]:
    """The tiers of whole answers by exact key, fastest first."""
    return rt.tiers.answers


def credit_store(rt: Runtime) -> CreditStore | None:
    return rt.credits.store


def key_store(rt: Runtime) -> KeyStore | None:
    return rt.credits.keys


def knowledge_summary(rt: Runtime) -> dict[str, Any] | None:
    """Per replica: the knowledge tree's size and the queue (``None`` without routing)."""
    return {"summary": rt.kv.summary()} if rt.kv is not None else None


def invalidator(rt: Runtime) -> TierInvalidation:
    """Invalidation over every registered tier (built per admin request: cheap)."""
    return rt.invalidator()
