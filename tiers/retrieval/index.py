"""The Proximity decisions: which cached search answers a new one, what is kept, what a write drops. Pure.

No bytes, no I/O, no awaits: :class:`ProximityIndex` deals in entry keys; the adapter
(:class:`tiers.retrieval.cache.RetrievalCache`) keeps the result bytes in a ``KeyValueStore`` under those
keys.

Layout:
- a *partition* per ``(tenant, params_hash)`` — ``params_hash`` already covers the collection, the vector name
  and every non-vector field — holds the cached searches that differ only in their query vector
  (:class:`tiers.retrieval.partition.Partition`);
- entry key ``rsearch:{tenant}:{exact_key}`` (exact_key = params hash + vector bytes), so an exact repeat is a
  dict lookup and the same search stored twice replaces itself;
- capacity: at most ``max_entries_per_partition`` per partition (the partition's least recently used goes
  first) and a total byte budget decided by the shared ``EvictionPolicy`` (LRU by default), sizes = result
  bytes + vector bytes + a fixed overhead + a cost per tracked point id (what each holds in memory, measured);
- invalidation: a version per collection, bumped by every write; a lookup records the versions it saw and a
  result is only admitted if none changed meanwhile (a search that raced a write is never stored). Writes drop
  entries at once: the whole collection, or — for deletes and payload changes of known ids — the entries whose
  result held one of the ids (a reverse index ``(collection, point id) → keys``, at most ``max_tracked_ids``
  ids per entry; an entry with more is treated as touched by every point write) plus the
  rank-/payload-sensitive ones (see ``normalizer.search_request``).

An approximate hit serves the cached result as it was: its ids, order and scores (and a ``score_threshold``'s cut)
are those of the cached query vector — the Proximity trade, measured as recall@k by the retrieval bench.

Matching: exact key first; then, for a dense item in a collection whose metric is known and whose tolerance is
> 0, the nearest cached vector of the partition if its distance is ``<= tolerance``
(``tiers.retrieval.distance``). Tolerances: per collection (and optionally per vector name); collections
without one use ``default_tolerance`` when their metric is Cosine and 0 (exact repeats only) otherwise —
absolute Euclid/Dot/Manhattan scales are data-specific.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from normalizer.search_request import Distance, SearchItem
from tiers.policies.base import EvictionPolicy
from tiers.retrieval.partition import Partition
from tiers.retrieval.writes import PointId, WriteEffect, WriteScope

ENTRY_OVERHEAD_BYTES = 2000
"""What an entry holds beyond its result and query vector: its key, its record, its places in the partition and the
reverse indexes (tracemalloc, ``tests/tiers/test_retrieval_cache.py``)."""
TRACKED_ID_BYTES = 400
"""What each point id an entry's result holds costs in the reverse index ``(collection, point id) → keys`` and the
entry's own set, when no other entry holds it (same test)."""
ALL_COLLECTIONS = "\x00all"
"""Pseudo collection name under which :meth:`ProximityIndex.versions` records the alias epoch."""
DEFAULT_COSINE_TOLERANCE = 0.015
"""Default Cosine tolerance (1 - cosine similarity): the largest grid value whose recall@10 over hits stayed
>= 0.95 in ``python -m loadtest.bench retrieval`` (full: 0.956, hit rate 0.804 vs 0.756 exact-only)."""


@dataclass(frozen=True, slots=True)
class Match:
    """A cached search answering the asked one: its key, the query-vector distance, whether exact."""

    key: str
    distance: float
    exact: bool


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of storing a result: admitted or not, and the keys whose bytes must now be deleted."""

    admitted: bool
    key: str
    evicted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Entry:
    partition: tuple[str, str]
    collection: str
    reads: frozenset[str]
    point_ids: frozenset[PointId] | None
    rank_sensitive: bool
    payload_sensitive: bool


class ProximityIndex:
    """Approximate search-result reuse decisions over partitions of cached query vectors."""

    def __init__(
        self,
        policy: EvictionPolicy,
        *,
        max_entries_per_partition: int = 1024,
        default_tolerance: float = DEFAULT_COSINE_TOLERANCE,
        max_tracked_ids: int = 256,
        max_versions: int = 10_000,
    ) -> None:
        self.policy = policy
        self.max_entries_per_partition = max_entries_per_partition
        self.default_tolerance = default_tolerance
        self.max_tracked_ids = max_tracked_ids
        self._metrics: OrderedDict[str, dict[str, Distance]] = OrderedDict()
        """Each collection's vector metrics, the ``max_versions`` most recently learned: every tenant's collection is
        its own, so their number is the tenants' to grow. One that left is learned again on its next search (and,
        as with any change of metrics, its cached searches go)."""
        self._tolerances: dict[tuple[str, str | None], float] = {}
        # Write versions are stamps from one counter; at most ``max_versions`` collections keep their own, the
        # least recently written leave and every collection without one reads ``_floor`` (the newest stamp that
        # left). Client-chosen collection names cannot grow the table, and a search that raced a write to a
        # collection whose stamp left since still sees a changed version (possibly spuriously: never stored).
        self.max_versions = max_versions
        self._versions: OrderedDict[str, int] = OrderedDict()
        self._stamp = 0
        self._floor = 0
        self._epoch = 0
        self._partitions: dict[tuple[str, str], Partition] = {}
        self._entries: dict[str, _Entry] = {}
        self._by_collection: dict[str, set[str]] = {}
        self._by_point: dict[tuple[str, PointId], set[str]] = {}

    def collections(self) -> list[str]:
        """The collections some cached search read."""
        return list(self._by_collection)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    # -- settings --------------------------------------------------------------------------------------------

    def set_metrics(self, collection: str, metrics: Mapping[str, Distance]) -> list[str]:
        """Record a collection's vector metrics (``GET /collections/{c}``); a change drops its entries."""
        known = self._metrics.pop(collection, None)
        self._metrics[collection] = dict(metrics)
        while len(self._metrics) > self.max_versions:
            self._metrics.popitem(last=False)
        if known != dict(metrics) and collection in self._by_collection:
            return self.invalidate(WriteEffect(WriteScope.COLLECTION, collection))
        return []

    def metrics(self, collection: str) -> dict[str, Distance] | None:
        """The recorded metrics of a collection; ``None`` until :meth:`set_metrics` was called for it."""
        known = self._metrics.get(collection)
        return None if known is None else dict(known)

    def metric(self, collection: str, vector_name: str) -> Distance | None:
        return self._metrics.get(collection, {}).get(vector_name)

    def set_tolerance(self, collection: str, tolerance: float, vector_name: str | None = None) -> None:
        """Tolerance in the collection's metric (``vector_name=None``: every vector of the collection)."""
        if tolerance < 0:
            raise ValueError("tolerance must be >= 0")
        self._tolerances[(collection, vector_name)] = tolerance

    def tolerance(self, collection: str, vector_name: str) -> float:
        for scope in ((collection, vector_name), (collection, None)):
            if scope in self._tolerances:
                return self._tolerances[scope]
        return self.default_tolerance if self.metric(collection, vector_name) is Distance.COSINE else 0.0

    def version(self, collection: str) -> int:
        """The collection's write version (``ALL_COLLECTIONS`` gives the epoch bumped by alias changes)."""
        if collection == ALL_COLLECTIONS:
            return self._epoch
        return self._versions.get(collection, self._floor)

    def versions(self, collections: Iterable[str]) -> dict[str, int]:
        """What a lookup records and hands back to :meth:`admit`: the epoch and each collection's version."""
        seen = {name: self.version(name) for name in collections}
        seen[ALL_COLLECTIONS] = self._epoch
        return seen

    # -- lookups ---------------------------------------------------------------------------------------------

    def match(self, tenant: str, collection: str, item: SearchItem) -> Match | None:
        """The cached search answering ``item`` (marked as used), or ``None``."""
        partition = self._partitions.get((tenant, item.params_hash))
        if partition is None:
            return None
        key = partition.exact(item.exact_key)
        found: Match | None = None
        if key is not None:
            found = Match(key=key, distance=0.0, exact=True)
        elif item.vector is not None:
            tolerance = self.tolerance(collection, item.vector_name)
            nearest = partition.nearest(item.vector) if tolerance > 0 else None
            if nearest is not None and nearest[1] <= tolerance:
                found = Match(key=nearest[0], distance=max(nearest[1], 0.0), exact=False)
        if found is not None:
            partition.touch(found.key)
            self.policy.hit(found.key)
        return found

    # -- storing ---------------------------------------------------------------------------------------------

    def admit(
        self,
        tenant: str,
        collection: str,
        item: SearchItem,
        *,
        result_ids: Iterable[PointId] | None,
        size: int,
        seen_versions: Mapping[str, int],
        cost: float = 1.0,
    ) -> Admission:
        """Decide whether ``item``'s result (``size`` bytes holding ``result_ids``) is kept (module docs)."""
        key = f"rsearch:{tenant}:{item.exact_key}"
        if any(self.version(name) != seen for name, seen in seen_versions.items()):
            return Admission(admitted=False, key=key)
        vector_bytes = item.vector.nbytes if item.vector is not None else 0
        ids = None if result_ids is None else frozenset(result_ids)
        if ids is not None and len(ids) > self.max_tracked_ids:
            ids = None
        held = size + vector_bytes + ENTRY_OVERHEAD_BYTES + TRACKED_ID_BYTES * len(ids or ())
        dropped = self.forget(key)
        decision = self.policy.insert(key, held, cost)
        if not decision.admitted:
            return Admission(admitted=False, key=key, evicted=tuple(dropped))
        evicted = [*dropped, *decision.evicted]
        for victim in decision.evicted:
            self._drop(victim)
        partition_id = (tenant, item.params_hash)
        partition = self._partitions.get(partition_id)
        if partition is None:
            partition = self._partitions[partition_id] = Partition(self.metric(collection, item.vector_name))
        while len(partition) >= self.max_entries_per_partition:
            victim = partition.oldest()
            self.policy.remove(victim)
            self._drop(victim)
            evicted.append(victim)
        entry = _Entry(
            partition=partition_id,
            collection=collection,
            reads=item.collections | {collection},
            point_ids=ids,
            rank_sensitive=item.rank_sensitive,
            payload_sensitive=item.payload_sensitive,
        )
        partition.add(key, item.exact_key, item.vector)
        self._entries[key] = entry
        for name in entry.reads:
            self._by_collection.setdefault(name, set()).add(key)
        for point in ids or ():
            self._by_point.setdefault((collection, point), set()).add(key)
        return Admission(admitted=True, key=key, evicted=tuple(evicted))

    def forget(self, key: str) -> list[str]:
        """Remove ``key`` (e.g. its bytes were lost from the store); the keys removed."""
        if key not in self._entries:
            return []
        self.policy.remove(key)
        self._drop(key)
        return [key]

    # -- invalidation ----------------------------------------------------------------------------------------

    def invalidate(self, effect: WriteEffect) -> list[str]:
        """Apply a write: bump versions and drop the affected entries; the keys dropped."""
        if effect.scope is WriteScope.ALL:
            self._epoch += 1
            return [key for key in list(self._entries) for _ in self.forget(key)]
        collection = effect.collection
        self._stamp += 1
        self._versions.pop(collection, None)
        self._versions[collection] = self._stamp
        while len(self._versions) > self.max_versions:
            _, stamp = self._versions.popitem(last=False)
            self._floor = max(self._floor, stamp)
        doomed: set[str] = set()
        for key in self._by_collection.get(collection, ()):
            entry = self._entries[key]
            if (
                effect.scope is WriteScope.COLLECTION
                or entry.collection != collection
                or entry.point_ids is None
                or (effect.scope is WriteScope.POINTS_REMOVED and entry.rank_sensitive)
                or (effect.scope is WriteScope.PAYLOAD_CHANGED and entry.payload_sensitive)
            ):
                doomed.add(key)
        for point in effect.point_ids:
            doomed |= self._by_point.get((collection, point), set())
        return [key for key in doomed for _ in self.forget(key)]

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        partition = self._partitions.get(entry.partition)
        if partition is not None:
            partition.remove(key)
            if not len(partition):
                del self._partitions[entry.partition]
        for name in entry.reads:
            keys = self._by_collection.get(name)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_collection[name]
        for point in entry.point_ids or ():
            keys = self._by_point.get((entry.collection, point))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_point[(entry.collection, point)]
