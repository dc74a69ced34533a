"""The cached query vectors of one partition (tenant, everything but the vector), searched linearly.

Why a linear numpy scan rather than hnswlib: a partition holds the searches that differ *only* in their
vector, and is capped (``max_entries_per_partition``, default 1024). A scan of 1024 x 384 float32 rows is one
mat-vec of ~1.5 MB — tens of microseconds, exact (no missed neighbour, so no recall loss of its own), with
O(1) inserts and deletes (swap-remove), where an HNSW graph would add build cost, approximate misses and
tombstones. Above ~20k rows per partition an ANN index would start to pay; the cap keeps partitions well below
that.

Rows are kept in the metric's comparison form (:func:`tiers.retrieval.distance.prepare`). Items without a
dense vector (sparse, id, recommend queries) live here by exact key only.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from normalizer.search_request import Distance
from tiers.retrieval.distance import FloatMatrix, FloatVector, distances, prepare


class Partition:
    """Keys of cached searches, their exact keys and (when dense) their query vectors; recency for the cap."""

    def __init__(self, metric: Distance | None) -> None:
        self.metric = metric
        self._rows: FloatMatrix | None = None
        self._row_keys: list[str] = []
        self._row_of: dict[str, int] = {}
        self._exact: dict[str, str] = {}
        self._exact_of: dict[str, str] = {}
        self._recency: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._recency)

    def __contains__(self, key: object) -> bool:
        return key in self._recency

    def oldest(self) -> str:
        """The least recently used key (the partition must not be empty)."""
        return next(iter(self._recency))

    def add(self, key: str, exact_key: str, vector: FloatVector | None) -> None:
        """Add (or replace) ``key``; ``vector`` is kept only when the partition's metric is known."""
        self.remove(key)
        previous = self._exact.get(exact_key)
        if previous is not None:
            self.remove(previous)
        self._exact[exact_key] = key
        self._exact_of[key] = exact_key
        self._recency[key] = None
        if vector is not None and self.metric is not None:
            self._append_row(key, prepare(self.metric, vector))

    def remove(self, key: str) -> None:
        if key not in self._recency:
            return
        del self._recency[key]
        del self._exact[self._exact_of.pop(key)]
        row = self._row_of.pop(key, None)
        if row is None or self._rows is None:
            return
        last = len(self._row_keys) - 1
        if row != last:
            moved = self._row_keys[last]
            self._rows[row] = self._rows[last]
            self._row_keys[row] = moved
            self._row_of[moved] = row
        self._row_keys.pop()

    def touch(self, key: str) -> None:
        if key in self._recency:
            self._recency.move_to_end(key)

    def exact(self, exact_key: str) -> str | None:
        return self._exact.get(exact_key)

    def nearest(self, vector: FloatVector) -> tuple[str, float] | None:
        """The closest cached vector's key and distance; ``None`` if empty, no metric, other dimension."""
        count = len(self._row_keys)
        if self.metric is None or self._rows is None or count == 0 or vector.shape[0] != self._rows.shape[1]:
            return None
        found = distances(self.metric, self._rows[:count], prepare(self.metric, vector))
        best = int(np.argmin(found))
        return self._row_keys[best], float(found[best])

    def _append_row(self, key: str, row: FloatVector) -> None:
        count = len(self._row_keys)
        if self._rows is None or self._rows.shape[1] != row.shape[0]:
            if count:  # another dimension than the rows held: keep the key exact-only
                return
            self._rows = np.empty((8, row.shape[0]), dtype=np.float32)
        elif count == self._rows.shape[0]:
            grown = np.empty((count * 2, row.shape[0]), dtype=np.float32)
            grown[:count] = self._rows[:count]
            self._rows = grown
        self._rows[count] = row
        self._row_keys.append(key)
        self._row_of[key] = count
