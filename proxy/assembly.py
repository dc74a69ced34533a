"""The order of the whole system: which stages each kind of request goes through.

Chat::

    identify → credits (reserve … settle) → prompt (its documents, read once) → cache_control → canonicalize →
    [stale_if_error] → store (on the way back) → L1 exact → L3 exact → L2 semantic → coalesce → shape → route →
    forward

An exact repeat is answered by an exact tier before any embedding is computed; L2 also searches the cold tier's
question vectors. Legacy completions: the same without prompt, L2, shape and route.

Each stage wraps the ones after it: the way back (store in the tiers, settle credits) runs in reverse order.
Embeddings: identify → credits → cache_control → per-item exact cache → forward.
Qdrant searches: identify → credits → documents (remembered for prompt detection) → retrieval cache → forward;
Qdrant writes: identify → invalidate → forward;
anything else: identify → forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from normalizer.bypass import BypassSettings
from normalizer.cache_control import CacheDefaults
from normalizer.canonical import RequestKind
from proxy.credits.stages import Credits, Identify, SearchCredits
from proxy.pipeline import Pipeline, Stage
from proxy.runtime import Runtime
from proxy.stages.cache_policy import ApplyCacheControl, Canonicalize
from proxy.stages.coalesce import Coalesce
from proxy.stages.embeddings import EmbeddingItemsCache
from proxy.stages.forward import ForwardToLLM, ForwardToQdrant
from proxy.stages.prompt import ReadPrompt
from proxy.stages.retrieval import InvalidateSearches, RegisterDocuments, RetrievalLookup
from proxy.stages.semantic import SemanticLookup
from proxy.stages.stale import StaleIfError
from proxy.stages.tiers import ExactLookup, StoreResponse


@dataclass(frozen=True)
class Pipelines:
    """One pipeline per kind of data-plane request."""

    chat: Pipeline
    completions: Pipeline
    embeddings: Pipeline
    llm_passthrough: Pipeline
    qdrant_search: Pipeline
    qdrant_write: Pipeline
    qdrant_passthrough: Pipeline


def build_pipelines(rt: Runtime) -> Pipelines:
    """Assemble every pipeline from the runtime's components."""
    trust = rt.settings.server.trust_forwarded
    to_llm = ForwardToLLM(rt.client, rt.backends, trust_forwarded=trust)
    qdrant = rt.settings.upstreams.qdrant
    to_qdrant = ForwardToQdrant(
        rt.client, qdrant.url, qdrant.api_key.get_secret_value() if qdrant.api_key else None, trust_forwarded=trust
    )
    identify: list[Stage] = [Identify(rt.credits.keys, open_mode=rt.settings.auth.mode == "open",
                                      key_cache_ttl_s=rt.settings.auth.key_cache_ttl_s)]
    billing = _billing(rt)
    tracer = rt.tracer
    return Pipelines(
        chat=Pipeline([*identify, *billing, *_prompt(rt), *_caching(rt, "chat"), *_kv(rt)], to_llm,
                      tracer=tracer),
        completions=Pipeline([*identify, *billing, *_caching(rt, "completion")], to_llm, tracer=tracer),
        embeddings=Pipeline([*identify, *billing, *_embedding_caching(rt)], to_llm, tracer=tracer),
        llm_passthrough=Pipeline(identify, to_llm, tracer=tracer),
        qdrant_search=Pipeline([*identify, *_search_billing(rt), *_documents(rt), *_search_cache(rt)], to_qdrant,
                               tracer=tracer),
        qdrant_write=Pipeline([*identify, *_search_invalidation(rt)], to_qdrant, tracer=tracer),
        qdrant_passthrough=Pipeline(identify, to_qdrant, tracer=tracer),
    )


def _billing(rt: Runtime) -> list[Stage]:
    """credits: reserve the worst case, settle the actual usage (hits at the tier's multiplier)."""
    store, credits = rt.credits.store, rt.settings.credits
    if store is None:
        return []
    return [Credits(store, rt.credits.prices, reservation_ttl_s=credits.reservation_ttl_s,
                    fail_open=credits.fail_open)]


def _search_billing(rt: Runtime) -> list[Stage]:
    store, credits = rt.credits.store, rt.settings.credits
    if store is None:
        return []
    return [SearchCredits(store, rt.credits.prices, reservation_ttl_s=credits.reservation_ttl_s,
                          fail_open=credits.fail_open)]


def _kv(rt: Runtime) -> list[Stage]:
    """shape → route: documents ordered for KV reuse, the replica chosen by estimated TTFT, prefix hints."""
    return [] if rt.kv is None else [rt.kv.shape, rt.kv.route]


def _prompt(rt: Runtime) -> list[Stage]:
    """prompt: the documents a chat prompt carries, read once for every cache tier and the KV stages."""
    return [] if rt.documents is None else [ReadPrompt(rt.documents)]


def _documents(rt: Runtime) -> list[Stage]:
    """documents: texts returned by searches are remembered, to be recognised inside later prompts."""
    return [] if rt.documents is None else [RegisterDocuments(rt.documents)]


def _search_cache(rt: Runtime) -> list[Stage]:
    """retrieval: exact and nearby query vectors reuse cached search results."""
    return [] if rt.retrieval is None else [RetrievalLookup(rt.retrieval, rt.fetch_collection)]


def _search_invalidation(rt: Runtime) -> list[Stage]:
    """invalidate: writes drop the cached searches they could change."""
    return [] if rt.retrieval is None else [InvalidateSearches(rt.retrieval)]


def _rules(rt: Runtime) -> tuple[CacheDefaults, BypassSettings]:
    cache = rt.settings.cache
    return (CacheDefaults(enabled=True, ttl=cache.l1.ttl_s),
            BypassSettings(unknown_fields=cache.unknown_fields, cache_sampled=cache.cache_sampled))


def _embedding_caching(rt: Runtime) -> list[Stage]:
    """cache_control → per-item exact cache, when caching is on."""
    cache = rt.settings.cache
    if not cache.enabled or not cache.l1.enabled:
        return []
    defaults, bypass = _rules(rt)
    scope = Canonicalize("embedding", bypass, rt.versions, frozenset(cache.shared_namespaces),
                         frozenset(cache.private_namespaces))
    return [ApplyCacheControl(defaults), EmbeddingItemsCache(rt.l1, scope, bypass)]


def _caching(rt: Runtime, kind: RequestKind) -> list[Stage]:
    """cache_control → canonicalize → store (on the way back) → L1 → L3 → L2 → coalesce, when caching is on."""
    cache = rt.settings.cache
    if not cache.enabled:
        return []
    defaults, bypass = _rules(rt)
    stages: list[Stage] = [
        ApplyCacheControl(defaults),
        Canonicalize(kind, bypass, rt.versions, frozenset(cache.shared_namespaces),
                     frozenset(cache.private_namespaces)),
        *([] if rt.stale is None else [StaleIfError(rt.stale, kind=kind, namespaces=cache.stale.namespaces)]),
        StoreResponse(rt.l1, kind=kind, expose_key=cache.expose_key, write_behind=rt.write_behind),
    ]
    if cache.l1.enabled:
        stages.append(ExactLookup(rt.l1))
    if rt.l3 is not None:
        stages.append(ExactLookup(rt.l3, promote_into=[rt.l1]))
    if rt.semantic is not None and kind == "chat":
        sources = [rt.l1] if rt.l3 is None else [rt.l1, rt.l3]
        stages.append(SemanticLookup(rt.semantic, sources, rt.l1, expose_similarity=cache.l2.expose_similarity,
                                     cold=rt.l3))
    stages.append(Coalesce(kind=kind, wait_s=cache.coalesce_wait_s))
    return stages
