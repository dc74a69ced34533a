"""``RetrievalCache``: the thin async driver around the Proximity decisions and a bytes store.

How the Qdrant route uses it (search → lookup → forward misses → store)::

    request = parse_search(path, raw_body, request.query)   # normalizer.search_request; None → just forward
    plan = await cache.lookup(tenant, request)
    if plan.complete:
        return plan.response()                                   # every item answered from the cache
    upstream_bytes = await qdrant.post(path, json=plan.upstream_body(body))   # only the missing searches
    merged = await cache.store(plan, upstream_bytes, cost=upstream_seconds)  # None: upstream failed
    return merged if merged is not None else upstream_bytes

    # after every non-read Qdrant request has returned from upstream (whatever its status; a search that
    # raced it is then refused by the version check). ``?wait=false`` writes are acknowledged before Qdrant
    # applies them, so a search right after one may still store the old result: clients that need read-your-
    # writes through the cache should write with ``wait=true`` (qdrant-client's default).
    for effect in write_effects(method, path, body):            # tiers.retrieval.writes
        await cache.invalidate(effect)

    # when the proxy first sees a collection (cache.knows(name) is False) and after it was recreated:
    await cache.learn_collection(name, get_collections_c_body)

``plan.hits[i]`` says how item ``i`` was answered (``Match.exact`` → ``X-Cache-Status: HIT``, else
``APPROX_HIT`` with ``Match.distance``). Caches fail open: a store error while reading counts as a miss, while
writing is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from normalizer.search_request import Distance, SearchRequest, vector_metrics
from tiers.budgets import MemoryAccount
from tiers.latency import LatencyHistogram
from tiers.memory import MemoryStore
from tiers.policies.base import EvictionPolicy
from tiers.policies.lru import LRUPolicy
from tiers.retrieval import batch as batching
from tiers.retrieval.index import DEFAULT_COSINE_TOLERANCE, Match, ProximityIndex
from tiers.retrieval.writes import WriteEffect
from tiers.storage import KeyValueStore

DEFAULT_CAPACITY_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class SearchPlan:
    """One search request after lookup: cached item results by position, the positions still to fetch."""

    tenant: str
    request: SearchRequest
    seen_versions: dict[str, int]
    started: float
    hits: dict[int, Match] = field(default_factory=dict)
    cached: dict[int, bytes] = field(default_factory=dict)
    misses: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.misses

    def response(self, elapsed_s: float | None = None) -> bytes:
        """The full answer when every item was cached."""
        if not self.complete:
            raise ValueError("items are still missing")
        ordered = [self.cached[i] for i in range(len(self.request.items))]
        return batching.response_bytes(ordered, self.request.batch, elapsed_s or 0.0)

    def upstream_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The request body asking upstream for the missing items only."""
        return batching.upstream_body(body, self.request.batch, self.misses)


class RetrievalCache:
    """Approximate (Proximity) and exact reuse of Qdrant search results."""

    name = "retrieval"

    def __init__(
        self,
        store: KeyValueStore | None = None,
        *,
        policy: EvictionPolicy | None = None,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        max_entries_per_partition: int = 1024,
        default_tolerance: float = DEFAULT_COSINE_TOLERANCE,
        max_tracked_ids: int = 256,
        ttl: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        # Embedded default: a MemoryStore as large as the index's budget; the index counts more bytes per entry
        # (value + vector + overhead) than the store (value), so the store never evicts on its own.
        policy = policy if policy is not None else LRUPolicy(capacity_bytes)
        self.results: KeyValueStore = store if store is not None else MemoryStore(LRUPolicy(policy.capacity))
        self.index = ProximityIndex(
            policy,
            max_entries_per_partition=max_entries_per_partition,
            default_tolerance=default_tolerance,
            max_tracked_ids=max_tracked_ids,
        )
        self.ttl = ttl
        self._clock = clock
        self.announce: Callable[[WriteEffect], Awaitable[object]] | None = None
        """Tells the other replicas about an invalidation (shared mode: :mod:`tiers.retrieval.shared`)."""
        self.counts = {"hit": 0, "miss": 0}
        """Searches (items of a batch) answered from the cache, and not."""
        self.lookup_seconds = LatencyHistogram()

    def memory(self) -> list[MemoryAccount]:
        """Its line of the memory ledger: the bytes its policy counts (results, query vectors, the ids they hold)."""
        policy = self.index.policy
        return [MemoryAccount("retrieval", policy.used, policy.capacity, len(self.index), "cache.retrieval.max_bytes")]

    # -- settings --------------------------------------------------------------------------------------------

    def collections(self) -> list[str]:
        """The collections that cached searches read (what a document invalidation without a collection visits)."""
        return self.index.collections()

    def knows(self, collection: str) -> bool:
        """Whether the collection's metrics were learned (else fetch ``GET /collections/{c}`` once)."""
        return self.index.metrics(collection) is not None

    async def learn_collection(self, collection: str, info: bytes | Mapping[str, Any]) -> dict[str, Distance]:
        """Read the metrics from a ``GET /collections/{c}`` body (unknown shape: exact repeats only); a change
        of a known collection's metrics drops its cached searches."""
        metrics = vector_metrics(info)
        await self._delete(self.index.set_metrics(collection, metrics))
        return metrics

    async def set_metric(self, collection: str, metric: Distance, vector_name: str = "") -> None:
        """Set one vector's metric by hand (configuration, tests)."""
        metrics = {**(self.index.metrics(collection) or {}), vector_name: metric}
        await self._delete(self.index.set_metrics(collection, metrics))

    def set_tolerance(self, collection: str, tolerance: float, vector_name: str | None = None) -> None:
        """Tolerance in the collection's own metric (see ``tiers.retrieval.distance``)."""
        self.index.set_tolerance(collection, tolerance, vector_name)

    # -- the request path ------------------------------------------------------------------------------------

    async def lookup(self, tenant: str, request: SearchRequest) -> SearchPlan:
        """Answer what the cache can; the plan lists the misses."""
        reads = {name for item in request.items for name in item.collections}
        plan = SearchPlan(
            tenant=tenant, request=request, seen_versions=self.index.versions(reads), started=self._clock()
        )
        for position, item in enumerate(request.items):
            found = self.index.match(tenant, request.collection, item)
            if found is None:
                continue
            try:
                value = await self.results.get(found.key)
            except Exception:  # fail open: a broken store is a miss
                value = None
            if value is None:
                self.index.forget(found.key)
                continue
            plan.hits[position] = found
            plan.cached[position] = value
        if self.index.versions(reads) != plan.seen_versions:  # a write raced the reads: serve nothing cached
            plan.hits.clear()
            plan.cached.clear()
        plan.misses = batching.split([plan.cached.get(i) for i in range(len(request.items))]).misses
        self.counts["hit"] += len(plan.hits)
        self.counts["miss"] += len(request.items) - len(plan.hits)
        self.lookup_seconds.observe(self._clock() - plan.started)
        return plan

    async def store(self, plan: SearchPlan, upstream: bytes | Mapping[str, Any], cost: float = 1.0) -> bytes | None:
        """Keep the upstream item results; the full response in request order (``None``: not a success)."""
        request = plan.request
        results = batching.item_results(upstream, request.batch, len(plan.misses))
        if results is None:
            return None
        fetched: list[bytes] = []
        for position, value in zip(plan.misses, results, strict=True):
            encoded = bytes(memoryview(orjson.dumps(value)))  # a copy of its size: orjson's keeps a 4 KB buffer
            fetched.append(encoded)
            item = request.items[position]
            admission = self.index.admit(
                plan.tenant,
                request.collection,
                item,
                result_ids=batching.result_point_ids(request.endpoint, value),
                size=len(encoded),
                seen_versions=plan.seen_versions,
                cost=cost,
            )
            await self._delete(admission.evicted)
            if admission.admitted:
                await self._put(admission.key, encoded, request.collection)
        ordered = batching.reassemble(len(request.items), plan.cached, fetched, plan.misses)
        return batching.response_bytes(ordered, request.batch, self._clock() - plan.started)

    async def invalidate(self, effect: WriteEffect, *, announce: bool = True) -> int:
        """Apply a write that went through the proxy (or an explicit invalidation), here and — when ``announce``
        and in shared mode — on every replica; the number of cached searches dropped here."""
        dropped = self.index.invalidate(effect)
        await self._delete(dropped)
        if announce and self.announce is not None:
            await self.announce(effect)
        return len(dropped)

    async def _put(self, key: str, value: bytes, collection: str) -> None:
        try:
            kept = await self.results.put(key, value, ttl=self.ttl, tags=(f"collection:{collection}",))
        except Exception:  # fail open
            kept = False
        if not kept:
            self.index.forget(key)

    async def _delete(self, keys: tuple[str, ...] | list[str]) -> None:
        for key in keys:
            try:
                await self.results.delete(key)
            except Exception:  # fail open: the index no longer points at it
                continue
