"""The contract of a cache tier and the set of tiers one configuration builds (see :mod:`proxy.answers.cache_tiers`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from proxy.answers.replies import StillStored, WriteBehind
from proxy.answers.settings import CacheSettings
from proxy.answers.shared_mode import SharedMode
from proxy.core.endpoints import Endpoint
from proxy.core.pipeline import Stage
from proxy.observability.metrics import GaugeReader
from proxy.search.stages import CollectionFetcher
from proxy.upstream.client import UpstreamClient
from tiers.budgets import MemoryAccount
from tiers.invalidation import Embedding, Removal, Selector
from tiers.latency import LatencyHistogram
from tiers.memory import MemoryStore
from tiers.response_tier import ResponseTier

T = TypeVar("T")
StageKind = Endpoint | Literal["search", "write"]
"""The requests a tier may add stages to: an LLM API's answers (its :class:`~proxy.core.endpoints.Endpoint`), Qdrant
searches, Qdrant writes."""
class CacheTier(Protocol):
    """What the assembly, the lifecycle and the admin plane need of a tier."""

    name: str
    answers: ResponseTier | None
    """Whole answers under their exact keys, when the tier holds them."""
    write_behind: WriteBehind | None
    """How the tier takes copies of new answers stored in a faster tier, when it does."""
    embedder: Embedding | None
    """The tier's embedding model, when it has one (a selector by meaning, ``near``, needs it)."""
    flushable: bool
    """Whether a flush may name the tier (L2 may not: its vectors point at L1/L3 answers and go with them)."""

    def stages(self, kind: StageKind, faster: Sequence[CacheTier]) -> list[Stage]:
        """This tier's stages for requests of ``kind`` (``faster``: the tiers registered before it)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def report(self) -> dict[str, Any]:
        """Sizes and counters for ``/admin/stats`` and the gauges."""
        ...

    def lookup_stats(self) -> LookupStats:
        """Lookups per result and their durations (``ragproxy_cache_lookups_total`` and ``_duration_seconds``)."""
        ...

    async def invalidate(self, selector: Selector, embedder: Embedding | None, removed: Removal) -> None:
        """Drop what ``selector`` names (``embedder``: for ``near``), adding it to ``removed``. Tiers are called in
        registration order, so a tier pointing at other tiers' answers sees the keys they removed."""
        ...

    async def flush(self, removed: Removal) -> None:
        """Drop everything the tier holds (a tier that is not :attr:`flushable`: what points at ``removed.keys``),
        adding it to ``removed``."""
        ...

    def gauges(self) -> Sequence[Gauge]:
        """The tier's own gauges, read at every scrape."""
        ...

    def memory(self) -> list[MemoryAccount]:
        """Its lines of the memory ledger (:mod:`tiers.budgets`): what it holds in process memory, against budgets."""
        ...



class TiersConfig(Protocol):
    """The settings the tiers are built from (:class:`proxy.assembly.config.Settings` is one)."""

    @property
    def cache(self) -> CacheSettings: ...

    @property
    def data_dir(self) -> Path: ...

@dataclass(frozen=True, slots=True)
class Gauge:
    """A gauge of ``/metrics``: its name, help text, label names and reader."""

    name: str
    text: str
    labels: list[str]
    read: GaugeReader


@dataclass(frozen=True, slots=True)
class LookupStats:
    """A tier's lookups so far: per result (``hit``, ``miss``, ``error``...), and how long they took."""

    results: Mapping[str, int]
    seconds: LatencyHistogram


@dataclass(frozen=True, slots=True)
class Off:
    """A registered tier that this configuration leaves out, and why (for the start-up summary and the admin)."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Build:
    """What a tier is built from: the settings, shared mode (when on), the tiers built before it, the Qdrant
    collection lookup, and the HTTP client its own outbound calls go through."""

    settings: TiersConfig
    shared: SharedMode | None
    built: Sequence[CacheTier]
    fetch_collection: CollectionFetcher
    client: UpstreamClient
    still_stored: StillStored | None = None
    """Whether a stored Responses API object is still kept upstream (its cached copies are served only then)."""


Builder = Callable[[Build], "CacheTier | Off"]


class TierSet:
    """The tiers built for one configuration, in lookup order."""

    def __init__(self, tiers: Sequence[CacheTier], off: Sequence[Off] = ()) -> None:
        self.tiers = tuple(tiers)
        self.off = tuple(off)

    def __iter__(self) -> Iterator[CacheTier]:
        return iter(self.tiers)

    @property
    def answers(self) -> list[ResponseTier]:
        """The tiers of whole answers by exact key, fastest first."""
        return [tier.answers for tier in self.tiers if tier.answers is not None]

    @property
    def first(self) -> ResponseTier | None:
        """Where a new answer is stored (the fastest answer tier)."""
        answers = self.answers
        return answers[0] if answers else None

    @property
    def write_behind(self) -> list[WriteBehind]:
        """Every tier's taker of copies of new answers."""
        return [tier.write_behind for tier in self.tiers if tier.write_behind is not None]

    def find(self, kind: type[T]) -> T | None:
        """The registered tier of class ``kind``, if this configuration has one."""
        return next((tier for tier in self.tiers if isinstance(tier, kind)), None)

    def stages(self, kind: StageKind) -> list[Stage]:
        """Every tier's stages for ``kind``, in registration order."""
        return [stage for index, tier in enumerate(self.tiers) for stage in tier.stages(kind, self.tiers[:index])]


async def answers_report(answers: ResponseTier) -> dict[str, Any]:
    """The report of a tier of whole answers: size and lookup counters."""
    size = await answers.stats()
    c = answers.counters
    lookups = c.hits + c.misses
    report: dict[str, Any] = {
        "entries": size.entries, "bytes": size.bytes,
        "lookups": {"hits": c.hits, "misses": c.misses, "stores": c.stores, "rejected": c.rejected,
                    "errors": c.errors, "corrupt": c.corrupt, "skipped": c.skipped},
        "hit_ratio": round(c.hits / lookups, 6) if lookups else 0.0,
        "breaker": {"state": answers.breaker.state.value, "opened": answers.breaker.opened_count}}
    if isinstance(answers.store, MemoryStore):
        report["expired"] = answers.store.expirations
    return report


def build_tiers(builders: Sequence[Builder], settings: TiersConfig, shared: SharedMode | None,
                fetch_collection: CollectionFetcher, client: UpstreamClient,
                still_stored: StillStored | None = None) -> TierSet:
    """Build, in order, every tier of ``builders`` that this configuration turns on."""
    built: list[CacheTier] = []
    off: list[Off] = []
    for build in builders:
        tier = build(Build(settings, shared, tuple(built), fetch_collection, client, still_stored))
        if isinstance(tier, Off):
            off.append(tier)
        else:
            built.append(tier)
    return TierSet(built, off)
