"""The order of the whole system: which stages each kind of request goes through.

Chat::

    identify → rate_limits → limits → idempotency → stream_usage → credits (… settle) → prompt (its documents, read
    once) →
    cache_control → canonicalize → [stale_if_error] → store (on the way back) → the tiers' lookups → coalesce →
    reserve → shape → route → forward

Credits look the caches up before they reserve: a request the caches answer is charged what it costs (its usage at
its tier's price, held before the answer is sent), and only one that goes upstream reserves its worst case, in the
reserve stage just before it does; a balance that cannot cover it is answered 429 ``insufficient_quota``
(:func:`proxy.credits.stages.out_of_credit`).

The tiers' lookups come from the registered cache tiers in order (:mod:`proxy.cache_tiers`): L1 exact → L3
exact → L2 semantic, so an exact repeat is answered before any embedding is computed (L2 also searches the cold
tier's question vectors). Legacy completions: the same without prompt, L2, shape and route. Responses API
(``POST /v1/responses``): the same as chat (L2, shape and route included) after a stored_responses stage that
lets a request continue only its own tenant's stored responses and records the ones it makes
(:mod:`proxy.stored.stages`), with its own credits (:class:`~proxy.credits.priced_apart.ResponseCredits`)
and its documents read from ``instructions`` and ``input`` (shape plans from that chat view but never reorders:
the body goes out as the client wrote it, plus hints); a stored answer's cache lifetime is bounded by the
upstream's retention. The requests about a stored response (each a :class:`~proxy.core.endpoints.Resource` row:
``/v1/responses/{id}`` and below, ``input_tokens``, ``compact``): identify → limits (the row's shape) →
stored_responses (every id it names the caller's, to the replica that keeps it) → credits (the row's price:
per request, or as model work for ``compact``) → forward.

Every API served as an :class:`~proxy.core.endpoints.Endpoint` row (chat, legacy completions, Responses, embeddings,
rerankers, vLLM's score API) gets one pipeline, built by one function from the row (:func:`build_pipelines`): its
shape checked by limits, its ``pricing``'s credit stage, the stored_responses stage when its requests make objects of
their own upstream (``owned``), and its ``cache``'s stages, handed the row: the stages never ask which API they serve.

Each stage wraps the ones after it: the way back (store in the tiers, settle credits) runs in reverse order.
Embeddings: identify → limits → idempotency → credits → cache_control → per-item exact cache → reserve → forward.
Rerankers (``/v1/rerank``, ``/rerank``, ``/v2/rerank``; ``/v1/score``, ``/score`` its own row): identify → limits →
idempotency → credits per document → cache_control → per-document exact cache → reserve → forward.
Qdrant searches: identify → limits → qdrant (the request built from its row in the tenant's namespace, the answer
mapped back: :mod:`proxy.search.requests`) → credits → documents (remembered for prompt detection) → the tiers'
search stages (the search cache) → reserve → forward; Qdrant writes: identify → qdrant → credits → the tiers' write
stages (invalidation) → forward; anything else: identify → qdrant → credits → forward. Wherever API keys are on,
rate_limits follows identify in every pipeline (requests and tokens per minute and budgets of the key, its user and
its tenant: :mod:`proxy.rate_limits.stage`), before everything else: a request is a request whatever answers it,
cache hits included.

The pipelines are built once per runtime. State that only some stages keep across requests is made here with them
(the coalescing flights and the stale answers, each shared by the stages of every kind of request), and every stage
that reads a live setting is registered in ``rt.live`` as it is made, so that ``PATCH /admin/config`` reaches it in
place (:mod:`proxy.assembly.live_settings`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from normalizer.bypass import BypassSettings
from normalizer.cache_control import CacheDefaults
from normalizer.limits import RequestLimits
from proxy.answers.cache_policy import ApplyCacheControl, Canonicalize, Lifetime
from proxy.answers.coalesce import Coalesce, Flights
from proxy.answers.replies import StoreResponse
from proxy.answers.stale import StaleIfError, StaleStore
from proxy.assembly.runtime import Runtime
from proxy.auth.identify import Identify
from proxy.core.endpoints import ENDPOINTS, RESOURCES, Cache, Endpoint, Pricing, RerankEndpoint, Resource
from proxy.core.headers import forwarded_headers
from proxy.core.limits import EnforceLimits
from proxy.core.pipeline import Pipeline, Stage
from proxy.core.prompt import PromptReader, ReadPrompt
from proxy.core.stream_usage import StreamUsage
from proxy.credits.priced_apart import RerankCredits, ResponseCredits
from proxy.credits.stages import Credits, RequestCredits, SearchCredits
from proxy.idempotency.stage import Idempotency
from proxy.items.embeddings import EmbeddingItemsCache
from proxy.items.rerank import RerankItemsCache
from proxy.rate_limits.stage import RateLimits
from proxy.search.requests import BuildQdrantRequest
from proxy.search.stages import RegisterDocuments
from proxy.search.tenancy import CollectionAccess
from proxy.stored.stages import ClaimStoredResponses, StoredResponseRequests, StoredResponses
from proxy.upstream.forward import ForwardToLLM, ForwardToQdrant
from tiers.response_tier import ResponseTier


@dataclass(frozen=True, slots=True)
class Pipelines:
    """One pipeline per endpoint row (:data:`proxy.core.endpoints.ENDPOINTS`) and per request about a stored
    response (:data:`~proxy.core.endpoints.RESOURCES`), and those of the routes that are not rows: the pass-throughs
    and the Qdrant routes."""

    served: Mapping[Endpoint, Pipeline]
    resources: Mapping[Resource, Pipeline]
    llm_passthrough: Pipeline
    qdrant_search: Pipeline
    qdrant_write: Pipeline
    qdrant_read: Pipeline

    def by_route(self) -> dict[str, Pipeline]:
        """Every pipeline by its route's name (an endpoint's ``route``, or the field's name)."""
        return {**{endpoint.route: pipeline for endpoint, pipeline in self.served.items()},
                **{resource.route: pipeline for resource, pipeline in self.resources.items()},
                "llm_passthrough": self.llm_passthrough,
                "qdrant_search": self.qdrant_search, "qdrant_write": self.qdrant_write,
                "qdrant_read": self.qdrant_read}


_CREDITS: Mapping[Pricing, type[Credits]] = {
    Pricing.TOKENS: Credits, Pricing.RESPONSE: ResponseCredits, Pricing.RERANK: RerankCredits,
    Pricing.REQUEST: RequestCredits}
"""The credit stage of each way of pricing an endpoint."""


def build_pipelines(rt: Runtime, endpoints: Iterable[Endpoint] = ENDPOINTS) -> Pipelines:
    """Assemble every pipeline from the runtime's components (the cache tiers' stages in registration order), one
    per row of ``endpoints``; the stages that own live settings are registered in ``rt.live``. Once per runtime."""
    trust = rt.settings.server.trust_forwarded
    forwarded = forwarded_headers(rt.settings.upstreams.forward_headers)
    to_llm = ForwardToLLM(rt.client, rt.backends, trust_forwarded=trust, forwarded=forwarded)
    qdrant = rt.settings.upstreams.qdrant
    to_qdrant = ForwardToQdrant(rt.client, qdrant.url, qdrant.api_key.get_secret_value() if qdrant.api_key else None,
                                trust_forwarded=trust, forwarded=forwarded)
    identify: list[Stage] = [Identify(rt.credits.keys, open_mode=rt.settings.auth.mode == "open",
                                      known=rt.credits.known_keys), *_rate_limits(rt)]
    limits = _limits(rt)
    to_tenant = BuildQdrantRequest(CollectionAccess.from_settings(qdrant), prefetch_depth=limits.prefetch_depth)
    tracer = rt.tracer
    caching = _Caching(rt)
    stored = StoredResponses(rt.owners, [backend.label for backend in rt.backends.backends],
                             lambda selector: rt.invalidator().invalidate(selector))
    rt.ledger.register(stored)

    def served(endpoint: Endpoint) -> Pipeline:
        """identify → limits (the row's shape) → idempotency → [stream_usage] → [stored_responses, when its requests
        make objects of their own upstream] → credits (the row's pricing) → the row's caches."""
        billing = _billing(rt, _CREDITS[endpoint.pricing])
        return Pipeline([*identify, EnforceLimits(limits, shape=endpoint.shape), *_idempotency(rt),
                         *_stream_usage(rt, endpoint),
                         *([ClaimStoredResponses(stored)] if endpoint.owned is not None else []),
                         *billing, *_caches(rt, endpoint, caching, _at_miss(billing))], to_llm, tracer=tracer)

    def resource(row: Resource) -> Pipeline:
        """identify → limits (the row's shape) → stored_responses (the ids it names) → credits (the row's price)."""
        return Pipeline([*identify, EnforceLimits(limits, shape=row.shape), StoredResponseRequests(stored, row),
                         *_billing(rt, _CREDITS[row.pricing])], to_llm, tracer=tracer)

    search_billing = _billing(rt, SearchCredits)
    return Pipelines(
        served={endpoint: served(endpoint) for endpoint in endpoints},
        resources={row: resource(row) for row in RESOURCES},
        llm_passthrough=Pipeline([*identify, *_billing(rt, RequestCredits)], to_llm, tracer=tracer),
        qdrant_search=Pipeline([*identify, EnforceLimits(limits, search=True), to_tenant, *search_billing,
                                *_documents(rt), *rt.tiers.stages("search"), *_at_miss(search_billing)], to_qdrant,
                               tracer=tracer),
        qdrant_write=Pipeline([*identify, to_tenant, *_billing(rt, RequestCredits), *rt.tiers.stages("write")],
                              to_qdrant, tracer=tracer),
        qdrant_read=Pipeline([*identify, to_tenant, *_billing(rt, RequestCredits)], to_qdrant, tracer=tracer),
    )


def _caches(rt: Runtime, endpoint: Endpoint, caching: _Caching, at_miss: list[Stage]) -> list[Stage]:
    """The stages of the row's ``cache``: whole answers (and the prompt, L2 and KV stages of an LLM API that reads
    one), or its items; ``at_miss`` (the reservation of what goes upstream) after the lookups, before the KV
    stages."""
    if endpoint.cache is Cache.EMBEDDING_ITEMS:
        return [*caching.items(endpoint, EmbeddingItemsCache), *at_miss]
    if endpoint.cache is Cache.RERANK_ITEMS:
        score = isinstance(endpoint, RerankEndpoint) and endpoint.score
        return [*caching.items(endpoint, lambda tier, scope: RerankItemsCache(tier, scope, score=score)), *at_miss]
    return _answers(rt, endpoint, caching, at_miss)


def _rate_limits(rt: Runtime) -> list[Stage]:
    """rate_limits: requests and tokens per minute and budgets of the key, user and tenant, before anything else."""
    counters = rt.credits.counters
    return [] if counters is None else [RateLimits(counters, rt.credits.prices, refused=rt.credits.limits_refused)]


def _limits(rt: Runtime) -> RequestLimits:
    """limits: outsized or overly deep bodies are refused before any stage reads them."""
    return RequestLimits(**rt.settings.limits.model_dump())


def _idempotency(rt: Runtime) -> list[Stage]:
    """idempotency: a repeated Idempotency-Key gets the first answer, charged once."""
    store, settings = rt.credits.idempotency, rt.settings.idempotency
    if store is None:
        return []
    return [Idempotency(store, ttl_s=settings.ttl_s, running_ttl_s=settings.running_ttl_s,
                        max_response_bytes=settings.max_response_bytes)]


def _stream_usage(rt: Runtime, endpoint: Endpoint) -> list[Stage]:
    """stream_usage: a stream of an API that reports usage only when asked is asked for it, when credits bill it or
    its answer may be stored (a replay must carry the usage its own request asks for); a client that did not ask
    does not see it."""
    if not endpoint.usage_on_request or (rt.credits.store is None and not rt.settings.cache.enabled):
        return []
    return [StreamUsage()]


def _billing(rt: Runtime, stage: type[Credits]) -> list[Credits]:
    """credits: reserve the worst case, settle the actual usage (hits at the tier's multiplier)."""
    store, credits = rt.credits.store, rt.settings.credits
    if store is None:
        return []
    return [stage(store, rt.credits.prices, reservation_ttl_s=credits.reservation_ttl_s, fail_open=credits.fail_open,
                  settling=rt.credits.settling)]


def _at_miss(billing: list[Credits]) -> list[Stage]:
    """reserve: a request the caches could not answer reserves its worst case here, just before the upstream; one
    they answered was charged by its credits stage only what it costs (a cached repeat is served on a balance too
    low for a miss)."""
    return [credits.at_miss() for credits in billing]


def _answers(rt: Runtime, endpoint: Endpoint, caching: _Caching, at_miss: list[Stage]) -> list[Stage]:
    """An LLM API's stages after its guards and credits: prompt → the answer caches → reserve → shape → route. The
    endpoint (:mod:`proxy.core.endpoints`) is chosen here, once, and every stage that reads its requests or answers
    gets it."""
    if endpoint.read_prompt is None:  # no prompt to read (legacy completions): no documents, no KV planning
        return [*caching.answers(endpoint), *at_miss]
    return [*_prompt(rt, endpoint.read_prompt), *caching.answers(endpoint), *at_miss, *_kv(rt, endpoint)]


def _kv(rt: Runtime, endpoint: Endpoint) -> list[Stage]:
    """shape → route: documents ordered for KV reuse, the replica chosen by estimated TTFT, prefix hints."""
    return [] if rt.kv is None else [rt.kv.shape.serving(endpoint), rt.kv.route.serving(endpoint)]


def _prompt(rt: Runtime, read: PromptReader) -> list[Stage]:
    """prompt: the documents a prompt carries, read once for every cache tier and the KV stages."""
    if rt.documents is None:
        return []
    return [ReadPrompt(rt.documents, read, rt.repeated)]


def _documents(rt: Runtime) -> list[Stage]:
    """documents: texts returned by searches are remembered, to be recognised inside later prompts."""
    return [] if rt.documents is None else [RegisterDocuments(rt.documents)]


class _Caching:
    """The cache stages of each kind of request, sharing the state they keep across requests and registered as the
    owners of the live cache settings they read."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.live = rt.live
        self.flights = Flights()
        stale = rt.settings.cache.stale
        self.stale = StaleStore(max_entries=stale.max_entries, max_bytes=stale.max_bytes,
                                max_stale_s=stale.max_stale_s) if stale.namespaces else None
        if self.stale is not None:
            rt.ledger.register(self.stale)

    def _control(self, lifetime: Lifetime | None = None) -> ApplyCacheControl:
        defaults = CacheDefaults(enabled=True, ttl=self.rt.settings.cache.l1.ttl_s)
        return self.live.register(ApplyCacheControl(defaults, lifetime))

    def _canonicalize(self, endpoint: Endpoint) -> Canonicalize:
        """The bypass rules and the exact key of the endpoint's requests (its prompt and ownership count)."""
        rt, cache = self.rt, self.rt.settings.cache
        bypass = BypassSettings(unknown_fields=cache.unknown_fields, cache_sampled=cache.cache_sampled,
                                cache_stored_responses=cache.cache_stored_responses,
                                rerank_max_documents=cache.rerank_max_documents)
        forwarded = forwarded_headers(rt.settings.upstreams.forward_headers)  # others never reach the upstream
        key_headers = tuple(name for name in cache.key_headers if name.lower() in forwarded)
        return self.live.register(Canonicalize(endpoint, bypass, rt.versions, frozenset(cache.shared_namespaces),
                                               frozenset(cache.private_namespaces), key_headers))

    def items(self, endpoint: Endpoint, stage: Callable[[ResponseTier, Canonicalize], Stage]) -> list[Stage]:
        """cache_control → per-item exact cache (embeddings inputs, reranker pairs) in the fastest answer tier,
        when there is one."""
        first = self.rt.tiers.first
        if first is None:
            return []
        return [self._control(), stage(first, self._canonicalize(endpoint))]

    def answers(self, endpoint: Endpoint) -> list[Stage]:
        """cache_control → canonicalize → [stale_if_error] → store (on the way back) → each tier's lookups →
        coalesce, when caching is on."""
        rt, live = self.rt, self.live
        cache = rt.settings.cache
        if endpoint.canonical is None:
            raise ValueError(f"endpoint {endpoint.route!r} caches whole answers but names no canonicaliser")
        if not cache.enabled:
            return []
        stale = self.stale
        return [
            self._control(endpoint.lifetime(rt.settings.upstreams.response_retention_s)),
            self._canonicalize(endpoint),
            *([] if stale is None else [StaleIfError(stale, endpoint=endpoint, namespaces=cache.stale.namespaces)]),
            live.register(StoreResponse(rt.tiers.first, endpoint=endpoint, expose_key=cache.expose_key,
                                        write_behind=rt.tiers.write_behind)),
            *rt.tiers.stages(endpoint),
            live.register(Coalesce(endpoint=endpoint, wait_s=cache.coalesce_wait_s, flights=self.flights,
                                   recheck=rt.tiers.first, still_stored=rt.still_stored)),
        ]
