"""The long-lived components of one proxy process: built from the settings, started in order and stopped in reverse.

Start-up enters every component into one :class:`~contextlib.AsyncExitStack` (shared mode, then each registered
cache tier in lookup order, the replicas' health probes, the credit components, the finish work of clients that
hung up); shutdown unwinds it, so a component is stopped only if it was started, and a failed start-up stops what
had started.

The runtime holds what lives beyond one stage: components that are started and stopped, that the admin API reads,
or that several kinds of stages share (the tiers, the document registry, the KV layer, the credit components).
State that only a stage uses (coalescing flights, stale answers) is made with that stage in
:mod:`proxy.assembly.pipelines`. The pipelines are built once; ``PATCH /admin/config`` changes settings in place through
:attr:`Runtime.live` (:mod:`proxy.assembly.live_settings`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from opentelemetry.trace import Tracer

from normalizer.documents import DocumentRegistry
from normalizer.repeated_blocks import RepeatedBlocks
from proxy.assembly.config import Settings
from proxy.assembly.credit_components import CreditComponents, build_credits
from proxy.assembly.live_settings import LiveSettings
from proxy.cache_tiers import REGISTERED
from proxy.cache_tiers.base import TierSet, build_tiers
from proxy.cache_tiers.invalidation import TierInvalidation
from proxy.cache_tiers.shared_mode import SharedMode, build_shared
from proxy.core.reply import drain_finishers
from proxy.idempotency.memory_store import MemoryIdempotencyStore
from proxy.kv.factory import KVLayer, build_kv
from proxy.kv.stages import SharedPrefixes
from proxy.observability.logs import LogLevel
from proxy.observability.metrics import Metrics, TierLookups
from proxy.observability.observe import AccessLog, Observer, observer
from proxy.observability.stats import RequestStats
from proxy.search.routes import collection_path
from proxy.stored.owners import OwnersUnavailable, RedisResponseOwners, ResponseOwners, SqliteResponseOwners
from proxy.upstream.backends import BackendPool
from proxy.upstream.client import UpstreamClient
from tiers.budgets import Measured, MemoryLedger
from tiers.policies.trace import TraceRecorder
from tiers.versions import KnowledgeVersions, VersionSource

log = logging.getLogger("ragproxy.runtime")


@dataclass
class Runtime:
    """Everything a pipeline stage may need, created once per process."""

    settings: Settings
    """The effective settings (replaced by :meth:`configure`)."""
    client: UpstreamClient = field(init=False)
    backends: BackendPool = field(init=False)
    metrics: Metrics = field(init=False)
    shared: SharedMode | None = field(init=False)
    """Shared mode (``redis.url``): several replicas act as one cache."""
    versions: VersionSource = field(init=False)
    tiers: TierSet = field(init=False)
    """The cache tiers, in lookup order (:mod:`proxy.cache_tiers`)."""
    documents: DocumentRegistry | None = field(init=False)
    """Documents from search results and paragraphs that moved between prompts (:attr:`repeated`), recognised in later
    prompts (when caching or routing is on)."""
    repeated: RepeatedBlocks | None = field(init=False)
    """The paragraphs seen in prompts, those that move between requests fed to :attr:`documents`."""
    kv: KVLayer | None = field(init=False)
    credits: CreditComponents = field(init=False)
    owners: ResponseOwners = field(init=False)
    """Which tenant and replica made each stored Responses API object (:mod:`proxy.stored.owners`)."""
    tracer: Tracer | None = field(init=False)
    trace: TraceRecorder | None = field(init=False)
    """The cache trace (``cache.trace_file``), replayed by ``ragproxy simulate``."""
    observe: Observer = field(init=False)
    """Accounts for each answered request (metrics, statistics, spans, logs)."""
    ledger: MemoryLedger = field(default_factory=MemoryLedger)
    """What each structure users name or fill holds, against its budget (:mod:`tiers.budgets`)."""
    live: LiveSettings = field(default_factory=LiveSettings)
    """The owners of the settings a patch may change (:mod:`proxy.assembly.live_settings`)."""
    stats: RequestStats = field(default_factory=RequestStats)
    draining: bool = False

    def __post_init__(self) -> None:
        settings = self.settings
        upstreams = settings.upstreams
        self.client = UpstreamClient(connect_timeout=upstreams.connect_timeout_s,
                                     read_timeout=upstreams.read_timeout_s, pool_size=upstreams.pool_size)
        self.backends = BackendPool(list(upstreams.llm), breaker_failures=upstreams.breaker_failures,
                                    breaker_open_s=upstreams.breaker_open_s)
        self.metrics = Metrics()
        self.shared = build_shared(settings, self.metrics)  # None unless redis.url is set
        self.versions = self.shared.versions if self.shared is not None else KnowledgeVersions()
        retention = upstreams.response_retention_s
        self.owners = RedisResponseOwners(self.shared.near.shared.client, ttl_s=retention,
                                          prefix=settings.redis.prefix) if self.shared is not None \
            else SqliteResponseOwners(settings.data_dir / "responses.sqlite3", ttl_s=retention)
        self.tiers = build_tiers(REGISTERED, settings, self.shared, self.fetch_collection, self.client,
                                 still_stored=self.still_stored)
        self.metrics.registry.register(TierLookups(lambda: [(t.name, s.results, s.seconds) for t in self.tiers
                                                            for s in (t.lookup_stats(),)]))
        routing = settings.routing
        self.documents = DocumentRegistry(routing.documents, max_bytes=routing.documents_max_bytes) \
            if settings.cache.enabled or routing.enabled else None
        self.repeated = RepeatedBlocks(routing.repeated_blocks_max_bytes) \
            if self.documents is not None and routing.repeated_blocks_max_bytes else None
        self.kv = build_kv(settings, self.backends, self.client)
        if self.kv is not None and self.shared is not None:
            bus = self.shared.bus
            self.kv.share(SharedPrefixes(self.shared.board, [b.label for b in upstreams.llm],
                                         lambda: max(1, bus.members)))
        self.credits = build_credits(settings)
        if isinstance(self.owners, RedisResponseOwners):
            self.owners.wipe = self.credits.wipe  # owners in a Redis that lost its data are not believed either
        self.credits.register_metrics(self.metrics)
        self._account()
        self.tracer = None
        if settings.telemetry.tracing:
            from proxy.core.tracing import make_tracer

            self.tracer = make_tracer(settings.telemetry.otlp_endpoint, settings.telemetry.service_name)
        trace_file = settings.cache.trace_file
        self.trace = TraceRecorder(trace_file) if trace_file is not None else None
        self.live.register(LogLevel())
        self.observe = observer(self, self.live.register(AccessLog(settings.logging.access_log)))
        self._stack: AsyncExitStack | None = None

    def _account(self) -> None:
        """Register the runtime's structures with the memory ledger (stages register their own when built)."""
        for tier in self.tiers:
            self.ledger.register(tier)
        documents = self.documents
        if documents is not None:
            self.ledger.register(Measured("documents", lambda: (documents.bytes, len(documents)),
                                          documents.max_bytes, "routing.documents_max_bytes"))
        repeated = self.repeated
        if repeated is not None:
            self.ledger.register(Measured("repeated_blocks", lambda: (repeated.bytes, len(repeated)),
                                          repeated.max_bytes, "routing.repeated_blocks_max_bytes"))
        idempotency = self.credits.idempotency
        if isinstance(idempotency, MemoryIdempotencyStore):
            self.ledger.register(Measured("idempotency", lambda: (idempotency.bytes, idempotency.entries),
                                          idempotency.max_bytes, "idempotency.max_bytes"))

    def configure(self, settings: Settings, changed: Iterable[str]) -> None:
        """Take ``settings`` (validated, differing from the current ones in the ``changed`` keys, all of them live)
        as the effective settings, and hand them to the owners of those keys."""
        self.settings = settings
        self.live.apply(settings, changed)

    def invalidator(self) -> TierInvalidation:
        """Invalidation over every registered tier (cheap: built per use); removed keys leave the request
        statistics too."""
        return TierInvalidation(self.tiers, self.stats.forget)

    async def still_stored(self, response_id: str) -> bool:
        """Whether a stored response is still kept: its owner is recorded (a delete through the proxy, or an
        upstream 404 for it, forgets the owner). An owner store that cannot answer counts as no: a cached copy
        is then not served, and the request goes upstream."""
        try:
            return await self.owners.owner(response_id) is not None
        except OwnersUnavailable:
            return False

    async def fetch_collection(self, name: str) -> bytes | None:
        """``GET /collections/{name}`` from Qdrant, ``name`` an upstream name (the search cache learns the
        collection's metric)."""
        qdrant = self.settings.upstreams.qdrant
        if qdrant.url is None:
            return None
        headers = {"api-key": qdrant.api_key.get_secret_value()} if qdrant.api_key else {}
        try:
            answer = await self.client.fetch("GET", qdrant.url + collection_path(name), headers=headers)
        except (OSError, ValueError):  # unknown metric: only exact repeats are reused
            return None
        return answer.body if answer.status == 200 else None

    async def start(self) -> None:
        """Start every component, in order; a failure stops the ones already started and is raised."""
        async with AsyncExitStack() as stack:
            stack.push_async_callback(self.client.close)
            if self.trace is not None:
                stack.callback(self.trace.close)
            if self.shared is not None:
                await self.shared.start()
                stack.push_async_callback(self.shared.stop)
            for tier in self.tiers:
                await tier.start()
                stack.push_async_callback(tier.stop)
            self.backends.start(self.client, self.settings.upstreams.health_interval_s,
                                self.settings.upstreams.health_interval_down_s)
            stack.push_async_callback(self.backends.stop)
            await self.credits.start()
            stack.push_async_callback(self.credits.stop)
            stack.push_async_callback(self.owners.close)
            stack.push_async_callback(drain_finishers, 10.0)  # first at shutdown: what clients left running
            self._stack = stack.pop_all()

    async def stop(self) -> None:
        """Stop what :meth:`start` started, in reverse order."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
