"""The contract every cache tier satisfies, below the features that implement it and the registry that builds them
(:mod:`proxy.cache_tiers`): what the assembly, the lifecycle and the admin plane need of a tier."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from proxy.core.endpoints import Endpoint
from proxy.core.pipeline import Stage
from tiers.budgets import MemoryAccount
from tiers.entry import CachedResponse
from tiers.invalidation import Embedding, Removal, Selector
from tiers.latency import LatencyHistogram
from tiers.response_tier import ResponseTier

StageKind = Endpoint | Literal["search", "write"]
"""The requests a tier may add stages to: an LLM API's answers (its :class:`~proxy.core.endpoints.Endpoint`), Qdrant
searches, Qdrant writes."""
WriteBehind = Callable[[str, CachedResponse, "float | None", list[str], Any], None]
"""Takes a copy of a new answer (key, entry, TTL, tags, the question's embedding or ``None``) without waiting."""
GaugeReader = Callable[[], Iterable[tuple[dict[str, str], float]]]
"""Reads a gauge's values, per label values, at every scrape."""


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
