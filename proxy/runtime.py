"""The long-lived components of one proxy process, built from the settings and started/stopped together."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Tracer

from normalizer.documents import DocumentRegistry
from proxy.config import Settings
from proxy.context import RequestContext
from proxy.credits.factory import CreditComponents, build_credits
from proxy.kv.factory import KVLayer, build_kv
from proxy.kv.stages import SharedPrefixes
from proxy.metrics import Metrics
from proxy.semantic_factory import build_semantic
from proxy.shared import SharedMode, build_shared
from proxy.stages.stale import StaleStore
from proxy.stats import HIT_STATUSES, RequestStats
from proxy.upstream.backends import BackendPool
from proxy.upstream.client import UpstreamClient
from tiers.cold import ColdStore
from tiers.demotion import Demoter
from tiers.entry import CachedResponse
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.policies.trace import TraceRecorder
from tiers.response_tier import ResponseTier
from tiers.retrieval import RetrievalCache
from tiers.semantic import SemanticTier
from tiers.versions import KnowledgeVersions, VersionSource

access_log = logging.getLogger("ragproxy.access")
log = logging.getLogger("ragproxy.runtime")


@dataclass
class Runtime:
    """Everything a pipeline stage may need, created once per process."""

    settings: Settings
    client: UpstreamClient = field(init=False)
    backends: BackendPool = field(init=False)
    l1: ResponseTier = field(init=False)
    l3: ResponseTier | None = field(init=False)
    demoter: Demoter | None = field(init=False)
    versions: VersionSource = field(init=False)
    retrieval: RetrievalCache | None = field(init=False)
    semantic: SemanticTier | None = field(init=False)
    documents: DocumentRegistry | None = field(init=False)
    """Documents from search results, recognised in later prompts (when caching or routing is on)."""
    metrics: Metrics = field(init=False)
    tracer: Tracer | None = field(init=False)
    credits: CreditComponents = field(init=False)
    shared: SharedMode | None = None
    kv: KVLayer | None = None
    stale: StaleStore | None = None
    semantic_ready: asyncio.Task[None] | None = None
    pipelines: Any = None  # proxy.assembly.Pipelines, set by the app (assembly imports this module)
    stats: RequestStats = field(default_factory=RequestStats)
    draining: bool = False

    def __post_init__(self) -> None:
        upstreams = self.settings.upstreams
        self.client = UpstreamClient(
            connect_timeout=upstreams.connect_timeout_s,
            read_timeout=upstreams.read_timeout_s,
            pool_size=upstreams.pool_size,
        )
        self.backends = BackendPool(list(upstreams.llm), breaker_failures=upstreams.breaker_failures,
                                    breaker_open_s=upstreams.breaker_open_s)
        l1 = self.settings.cache.l1
        self.l1 = ResponseTier("l1", MemoryStore(make_policy(l1.policy, l1.max_bytes), max_entries=l1.max_entries))
        self.l3, self.demoter = None, None
        l3 = self.settings.cache.l3
        if self.settings.cache.enabled and l3.enabled:
            cold = ColdStore(self.settings.data_dir / "cold", max_bytes=l3.max_bytes,
                             policy=make_policy(l3.policy, l3.max_bytes))
            self.l3 = ResponseTier("l3", cold, op_timeout=2.0)
            self.demoter = Demoter(cold, max_queue=l3.write_queue)
        self.versions = KnowledgeVersions()
        l2 = self.settings.cache.l2
        self.semantic = build_semantic(l2, self.settings.data_dir) if self.settings.cache.enabled and l2.enabled \
            else None
        self._tasks: list[asyncio.Task[None]] = []
        search = self.settings.cache.retrieval
        self.retrieval = None
        if self.settings.cache.enabled and search.enabled:
            self.retrieval = RetrievalCache(
                policy=make_policy(search.policy, search.max_bytes),
                capacity_bytes=search.max_bytes, default_tolerance=search.tolerance, ttl=search.ttl_s,
            )
            for collection, tolerance in search.collection_tolerances.items():
                self.retrieval.set_tolerance(collection, tolerance)
        self.metrics = Metrics()
        routing = self.settings.routing
        self.documents = DocumentRegistry(routing.documents, max_bytes=routing.documents_max_bytes) \
            if self.settings.cache.enabled or routing.enabled else None
        self.kv = build_kv(self.settings, self.backends)
        stale = self.settings.cache.stale
        self.stale = StaleStore(max_entries=stale.max_entries, max_bytes=stale.max_bytes,
                                max_stale_s=stale.max_stale_s) if stale.namespaces else None
        self.shared = build_shared(self.settings, self.metrics)  # None unless redis.url is set
        if self.shared is not None:
            self.l1 = self.shared.l1
            self.versions = self.shared.versions
            if self.kv is not None:
                self.kv.share(SharedPrefixes(self.shared.board, [b.label for b in self.settings.upstreams.llm]))
        trace_file = self.settings.cache.trace_file
        self.trace = TraceRecorder(trace_file) if trace_file is not None else None
        self.credits = build_credits(self.settings)
        self.credits.register_metrics(self.metrics)
        telemetry = self.settings.telemetry
        self.tracer = None
        if telemetry.tracing:
            from proxy.tracing import make_tracer

            self.tracer = make_tracer(telemetry.otlp_endpoint, telemetry.service_name)

    async def _warm_up(self, count: int) -> None:
        """Copy the cold tier's hottest entries into L1, so a restarted proxy starts warm."""
        assert self.l3 is not None and isinstance(self.l3.store, ColdStore)
        for cold in await self.l3.store.hottest(count):
            store = self.l1.store
            assert isinstance(store, MemoryStore)
            store.put_nowait(cold.key, cold.value, ttl=cold.ttl, tags=cold.tags, cost=cold.cost)

    def observe(self, ctx: RequestContext, status: int, seconds: float) -> None:
        """Account for one answered request: metrics, the request span, the access log line."""
        metrics = self.metrics
        cache_status = ctx.cache_status or "NONE"
        metrics.per_request.answered(ctx.route, status, cache_status, seconds)
        if ctx.cache_tier:
            metrics.child(metrics.tier_lookups, ctx.cache_tier, "hit").inc()
        backend = ctx.backend
        label = backend.label if backend is not None else ("qdrant" if "qdrant" in ctx.route else "llm")
        if ctx.upstream_seconds is not None:
            metrics.per_request.upstream(label, ctx.upstream_seconds)
        if ctx.reported_cached_tokens:
            metrics.child(metrics.prefix_tokens, label).inc(ctx.reported_cached_tokens)
        charged = ctx.response_headers.get("X-Credits-Charged")
        if charged:
            metrics.child(metrics.credits_charged, "hit" if ctx.cache_tier else "upstream").inc(float(charged))
        entry = ctx.entry
        if self.trace is not None and entry is not None and ctx.cache_key is not None:
            self.trace.record(ctx.cache_key, len(entry.body), entry.cost, time.time())
        asked: dict[str, str] | None = None
        if cache_status in HIT_STATUSES:  # the top-entries list says who asked
            semantic = ctx.semantic
            asked = {"tenant": ctx.tenant, "namespace": ctx.namespace,
                     **({"question": semantic.question[:200]} if semantic is not None else {})}
        saved = self.stats.record(
            route=ctx.route, cache_status=ctx.cache_status, tier=ctx.cache_tier, key=ctx.cache_key,
            upstream_seconds=ctx.upstream_seconds, hit_cost=entry.cost if entry is not None else None, label=asked)
        if saved:
            metrics.child(metrics.cost_saved, ctx.cache_tier or "unknown").inc(saved)
        if ctx.cache_tier == "coalesced":
            metrics.child(metrics.events, "coalesce", "coalesced").inc()
        if self.tracer is not None:
            from proxy.tracing import end_request_span

            end_request_span(ctx, status)
        if self.settings.logging.access_log:
            access_log.info("%s %s %d", ctx.method, ctx.route, status, extra={
                "request_id": ctx.request_id, "tenant": ctx.tenant, "route": ctx.route, "tier": ctx.cache_tier,
                "status": status, "latency_ms": round(seconds * 1000, 3)})

    async def fetch_collection(self, name: str) -> bytes | None:
        """``GET /collections/{name}`` from Qdrant (the retrieval cache learns the collection's metric)."""
        qdrant = self.settings.upstreams.qdrant
        if qdrant.url is None:
            return None
        headers = {"api-key": qdrant.api_key.get_secret_value()} if qdrant.api_key else {}
        try:
            async with self.client.session.get(f"{qdrant.url}/collections/{name}", headers=headers) as response:
                return await response.read() if response.status == 200 else None
        except Exception:  # unknown metric: only exact repeats are reused
            return None

    def write_behind(self, key: str, entry: CachedResponse, ttl: float | None, tags: list[str],
                     vector: Any = None) -> None:
        """Queue a copy of a new L1 entry for the cold tier (never blocks; dropped and counted when full), with
        the question's embedding when the semantic tier computed one (so L3 can answer semantic lookups)."""
        if self.demoter is not None:
            self.demoter.offer(key, entry.encode(), frozenset(tags), entry.cost, ttl, vector=vector)

    async def start(self) -> None:
        if self.shared is not None:
            await self.shared.start()
            if self.l3 is not None:
                self.shared.follow(self.l3)
        if self.demoter is not None:
            self.demoter.start()
        if self.l3 is not None and self.settings.cache.l3.warmup_entries and self.shared is None:
            await self._warm_up(self.settings.cache.l3.warmup_entries)
        if self.semantic is not None:
            await self._start_semantic(self.semantic)
        self.backends.start(self.client.session, self.settings.upstreams.health_interval_s)
        await self.credits.start()

    async def _start_semantic(self, semantic: SemanticTier) -> None:
        """Reload the persisted index, and save it every ``persist_interval_s`` (and at stop)."""
        load = getattr(semantic.store, "load", None)
        if load is not None:
            await load()
        interval = self.settings.cache.l2.persist_interval_s

        async def persist_periodically() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await semantic.store.persist()
                except Exception as exc:
                    log.warning("semantic index not saved: %s", exc)

        self._tasks.append(asyncio.create_task(persist_periodically(), name="semantic-persist"))
        self.semantic_ready = asyncio.create_task(self._warm_embedder(semantic), name="semantic-warm-up")

    @staticmethod
    async def _warm_embedder(semantic: SemanticTier) -> None:
        """Load the model in the background at start, so no request waits for it (lookups fail open until then)."""
        try:
            await semantic.embedder.embed(["warm-up"])
        except Exception as exc:
            log.warning("embedding model failed to load: %s; the semantic tier fails open", exc)

    async def stop(self) -> None:
        from proxy.routes.respond import drain_finishers

        await drain_finishers(10.0)
        if self.semantic_ready is not None:
            self.semantic_ready.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.semantic is not None:
            try:
                await self.semantic.store.persist()
            finally:
                await self.semantic.store.close()
                await self.semantic.embedder.close()
        await self.backends.stop()
        if self.demoter is not None:
            await self.demoter.stop()
        if self.l3 is not None:
            await self.l3.store.close()
        await self.credits.close()
        if self.shared is not None:
            await self.shared.stop()
        await self.client.close()
        if self.trace is not None:
            self.trace.close()
