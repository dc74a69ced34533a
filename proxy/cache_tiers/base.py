"""What a cache tier is built from and the set of tiers one configuration builds (see :mod:`proxy.cache_tiers`; the
contract a tier satisfies is :class:`proxy.core.cache_tier.CacheTier`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from proxy.answers.replies import StillStored
from proxy.answers.settings import CacheSettings
from proxy.cache_tiers.shared_mode import SharedMode
from proxy.core.cache_tier import CacheTier, Off, StageKind, WriteBehind
from proxy.core.pipeline import Stage
from proxy.search.stages import CollectionFetcher
from proxy.upstream.client import UpstreamClient
from tiers.memory import MemoryStore
from tiers.response_tier import ResponseTier

T = TypeVar("T")


class TiersConfig(Protocol):
    """The settings the tiers are built from (:class:`proxy.assembly.config.Settings` is one)."""

    @property
    def cache(self) -> CacheSettings: ...

    @property
    def data_dir(self) -> Path: ...


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
