"""The order of the whole system: which stages each kind of request goes through.

Chat::

    identify → credits (reserve … settle) → prompt (its documents, read once) → cache_control → canonicalize →
    [stale_if_error] → store (on the way back) → the tiers' lookups → coalesce → shape → route → forward

The tiers' lookups come from the registered cache tiers in order (:mod:`proxy.cache_tiers`): L1 exact → L3
exact → L2 semantic, so an exact repeat is answered before any embedding is computed (L2 also searches the cold
tier's question vectors). Legacy completions: the same without prompt, L2, shape and route.

Each stage wraps the ones after it: the way back (store in the tiers, settle credits) runs in reverse order.
Embeddings: identify → credits → cache_control → per-item exact cache → forward.
Qdrant searches: identify → credits → documents (remembered for prompt detection) → the tiers' search stages (the
search cache) → forward; Qdrant writes: identify → the tiers' write stages (invalidation) → forward;
anything else: identify → forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
from proxy.stages.retrieval import RegisterDocuments
from proxy.stages.stale import StaleIfError
from proxy.stages.tiers import StoreResponse


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
    """Assemble every pipeline from the runtime's components (the cache tiers' stages in registration order)."""
    trust = rt.settings.server.trust_forwarded
    to_llm = ForwardToLLM(rt.client, rt.backends, trust_forwarded=trust)
    qdrant = rt.settings.upstreams.qdrant
    to_qdrant = ForwardToQdrant(
        rt.client, qdrant.url, qdrant.api_key.get_secret_value() if qdrant.api_key else None, trust_forwarded=trust
    )
    identify: list[Stage] = [Identify(rt.credits.keys, open_mode=rt.settings.auth.mode == "open",
                                      key_cache_ttl_s=rt.settings.auth.key_cache_ttl_s, known=rt.credits.known_keys)]
    billing = _billing(rt, Credits)
    tracer = rt.tracer
    return Pipelines(
        chat=Pipeline([*identify, *billing, *_prompt(rt), *_caching(rt, "chat"), *_kv(rt)], to_llm,
                      tracer=tracer),
        completions=Pipeline([*identify, *billing, *_caching(rt, "completion")], to_llm, tracer=tracer),
        embeddings=Pipeline([*identify, *billing, *_embedding_caching(rt)], to_llm, tracer=tracer),
        llm_passthrough=Pipeline(identify, to_llm, tracer=tracer),
        qdrant_search=Pipeline([*identify, *_billing(rt, SearchCredits), *_documents(rt), *rt.tiers.stages("search")],
                               to_qdrant, tracer=tracer),
        qdrant_write=Pipeline([*identify, *rt.tiers.stages("write")], to_qdrant, tracer=tracer),
        qdrant_passthrough=Pipeline(identify, to_qdrant, tracer=tracer),
    )


def _billing(rt: Runtime, stage: type[Credits]) -> list[Stage]:
    """credits: reserve the worst case, settle the actual usage (hits at the tier's multiplier)."""
    store, credits = rt.credits.store, rt.settings.credits
    if store is None:
        return []
    return [stage(store, rt.credits.prices, reservation_ttl_s=credits.reservation_ttl_s, fail_open=credits.fail_open,
                  settling=rt.credits.settling)]


def _kv(rt: Runtime) -> list[Stage]:
    """shape → route: documents ordered for KV reuse, the replica chosen by estimated TTFT, prefix hints."""
    return [] if rt.kv is None else [rt.kv.shape, rt.kv.route]


def _prompt(rt: Runtime) -> list[Stage]:
    """prompt: the documents a chat prompt carries, read once for every cache tier and the KV stages."""
    return [] if rt.documents is None else [ReadPrompt(rt.documents)]


def _documents(rt: Runtime) -> list[Stage]:
    """documents: texts returned by searches are remembered, to be recognised inside later prompts."""
    return [] if rt.documents is None else [RegisterDocuments(rt.documents)]


def _rules(rt: Runtime) -> tuple[CacheDefaults, BypassSettings]:
    cache = rt.settings.cache
    return (CacheDefaults(enabled=True, ttl=cache.l1.ttl_s),
            BypassSettings(unknown_fields=cache.unknown_fields, cache_sampled=cache.cache_sampled))


def _canonicalize(rt: Runtime, kind: RequestKind, bypass: BypassSettings) -> Canonicalize:
    cache = rt.settings.cache
    return Canonicalize(kind, bypass, rt.versions, frozenset(cache.shared_namespaces),
                        frozenset(cache.private_namespaces))


def _embedding_caching(rt: Runtime) -> list[Stage]:
    """cache_control → per-item exact cache in the fastest answer tier, when there is one."""
    first = rt.tiers.first
    if first is None:
        return []
    defaults, bypass = _rules(rt)
    return [ApplyCacheControl(defaults), EmbeddingItemsCache(first, _canonicalize(rt, "embedding", bypass), bypass)]


def _caching(rt: Runtime, kind: Literal["chat", "completion"]) -> list[Stage]:
    """cache_control → canonicalize → [stale_if_error] → store (on the way back) → each tier's lookups → coalesce,
    when caching is on."""
    cache = rt.settings.cache
    if not cache.enabled:
        return []
    defaults, bypass = _rules(rt)
    return [
        ApplyCacheControl(defaults),
        _canonicalize(rt, kind, bypass),
        *([] if rt.stale is None else [StaleIfError(rt.stale, kind=kind, namespaces=cache.stale.namespaces)]),
        StoreResponse(rt.tiers.first, kind=kind, expose_key=cache.expose_key, write_behind=rt.tiers.write_behind),
        *rt.tiers.stages(kind),
        Coalesce(kind=kind, wait_s=cache.coalesce_wait_s, flights=rt.flights),
    ]
