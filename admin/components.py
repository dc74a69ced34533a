"""The runtime's optional components, as the admin API sees them.

The admin app reads the runtime through these small accessors so that it works with whatever the runtime has:
only ``rt.l1``, ``rt.versions``, ``rt.backends``, ``rt.metrics``, ``rt.settings`` and ``rt.stats`` are required.
The rest is looked up by attribute and used when present:

- ``rt.response_tiers`` (a list of :class:`~tiers.response_tier.ResponseTier`), else ``rt.l1`` plus any of
  ``rt.l2``, ``rt.l3``, ``rt.cold`` that is a ``ResponseTier``;
- ``rt.semantic``: the semantic tier (``delete(keys)`` and ``embedder.embed(texts)``);
- ``rt.retrieval``: the retrieval cache (``invalidate(WriteEffect)``); the collections it has cached searches
  of come from ``rt.retrieval.collections()`` when it offers that method;
- ``rt.credits``: a credit store (``balance``/``top_up``/``ledger``), or an object with ``.store`` (and
  optionally ``.keys``); API keys from ``rt.keys`` or ``rt.credits.keys`` (``create``/``list``/``revoke``);
- ``rt.kv``: the knowledge trees, summarized by ``rt.kv.summary()`` when it exists, else by the sizes of the
  trees in ``rt.kv.trees``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from proxy.credits.keys import KeyStore
from proxy.credits.store import CreditStore
from proxy.runtime import Runtime
from tiers.invalidation import Invalidator
from tiers.response_tier import ResponseTier

OPTIONAL_TIER_ATTRIBUTES = ("l2", "l3", "cold")


def response_tiers(rt: Runtime) -> list[ResponseTier]:
    listed = getattr(rt, "response_tiers", None)
    if isinstance(listed, list | tuple) and all(isinstance(t, ResponseTier) for t in listed):
        return list(listed)
    tiers = [rt.l1]
    for name in OPTIONAL_TIER_ATTRIBUTES:
        tier = getattr(rt, name, None)
        if isinstance(tier, ResponseTier) and tier not in tiers:
            tiers.append(tier)
    return tiers


def semantic_tier(rt: Runtime) -> Any | None:
    semantic = getattr(rt, "semantic", None)
    return semantic if semantic is not None and hasattr(semantic, "delete") else None


def retrieval_cache(rt: Runtime) -> Any | None:
    retrieval = getattr(rt, "retrieval", None)
    return retrieval if retrieval is not None and hasattr(retrieval, "invalidate") else None


def credit_store(rt: Runtime) -> CreditStore | None:
    credits = getattr(rt, "credits", None)
    if credits is None:
        return None
    if isinstance(credits, CreditStore):
        return credits
    store = getattr(credits, "store", None)
    return store if isinstance(store, CreditStore) else None


def key_store(rt: Runtime) -> KeyStore | None:
    for candidate in (getattr(rt, "keys", None), getattr(getattr(rt, "credits", None), "keys", None)):
        if isinstance(candidate, KeyStore):
            return candidate
    return None


def knowledge_summary(rt: Runtime) -> dict[str, Any] | None:
    kv = getattr(rt, "kv", None)
    if kv is None:
        return None
    summary = getattr(kv, "summary", None)
    if callable(summary):
        value = summary()
        return dict(value) if isinstance(value, Mapping) else {"summary": value}
    trees = getattr(kv, "trees", None)
    if trees is None:
        return None
    items: Iterable[tuple[Any, Any]] = trees.items() if isinstance(trees, Mapping) else enumerate(trees)
    return {"trees": [{"replica": str(name), "tokens": getattr(tree, "size_tokens", None),
                       "nodes": getattr(tree, "node_count", None),
                       "capacity_tokens": getattr(tree, "capacity_tokens", None),
                       "evictions": getattr(tree, "evictions", None)} for name, tree in items]}


def _collections(retrieval: Any) -> Callable[[], Iterable[str]] | None:
    listing = getattr(retrieval, "collections", None)
    return listing if callable(listing) else None


def invalidator(rt: Runtime) -> Invalidator:
    """An :class:`Invalidator` over everything the runtime has now (built per admin request: cheap)."""
    semantic = semantic_tier(rt)
    retrieval = retrieval_cache(rt)
    return Invalidator(
        response_tiers(rt), semantic=semantic, embedder=getattr(semantic, "embedder", None),
        retrieval=retrieval, collections=_collections(retrieval) if retrieval is not None else None,
        on_removed=rt.stats.forget,
    )
