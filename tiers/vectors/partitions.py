"""The vectors of one partition of the embedded vector store: an exact scan while small, an hnswlib graph when large.

Why two kinds: an ``hnswlib.Index`` costs about 2.6 MB the moment it exists, whatever it holds (65,536 label locks
of 40 bytes each, allocated by its constructor), so a store with one index per partition paid that for every
namespace, system prompt or other context a client named. A partition starts as :class:`FlatVectors`, a float32
matrix scanned exactly (one matrix-vector product: tens of microseconds for the few hundred rows most partitions
hold, and no missed neighbour), sized by what it holds. Past :data:`GRAPH_FROM` rows it becomes a
:class:`GraphVectors` (hnswlib, inner-product space), where the graph's fixed cost is small beside its rows and a
scan would grow slow. Both grow by doubling their capacity; neither shrinks (deleted rows and slots are reused).

Sizes (:attr:`nbytes`) are what each holds by construction: the matrix's bytes; hnswlib's level-0 array (the
vector, ``2M`` links, a label), a link-list pointer, a level, a lock and a visited-list mark per slot, plus the
fixed label locks (hnswlib 0.8, ``hnswalg.h``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import hnswlib
import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]

GRAPH_FROM = 1024
"""Rows from which a partition is an hnswlib graph rather than an exact scan (2.6 MB of fixed cost beside 1.5 MB of
rows at 384 dimensions, and a scan of about 0.1 ms)."""
GRAPH_FIXED_BYTES = 65_536 * 40 + 4096
"""What an ``hnswlib.Index`` allocates whatever its size: its label-operation locks (a ``std::mutex`` is 40 bytes)."""
FLAT_FIXED_BYTES = 400
"""A flat partition's objects (the matrix's header, the key list and row map) while empty."""


def graph_slot_bytes(dim: int, m: int) -> int:
    """Bytes of one hnswlib slot: level-0 record (vector, ``2m`` links and their count, label), link-list pointer,
    level, per-element lock, visited-list mark, label-map node, and the upper levels' links on average
    (one element in ``m`` has them)."""
    return dim * 4 + (2 * m * 4 + 4) + 8 + 8 + 4 + 40 + 2 + 48 + (m * 4 + 4) // m


class Vectors(Protocol):
    """The vectors of one partition, by id."""

    kind: str

    def __len__(self) -> int: ...

    @property
    def capacity(self) -> int:
        """Rows held without growing."""
        ...

    @property
    def nbytes(self) -> int: ...

    def nbytes_at(self, capacity: int) -> int:
        """What it would hold at ``capacity`` rows."""
        ...

    def add(self, ids: Sequence[str], vectors: Matrix) -> None:
        """Add ``ids`` (none of them held), growing by doubling when full."""

    def remove(self, vector_id: str) -> None: ...

    def nearest(self, vector: Matrix, k: int) -> list[tuple[str, float]]:
        """Up to ``k`` (id, cosine), most similar first."""
        ...

    def save(self, path: Path) -> None: ...


def grown(capacity: int, live: int) -> int:
    """The capacity that holds ``live`` rows: ``capacity`` while it does, else doubled (or ``live``, if more)."""
    return capacity if live <= capacity else max(live, 2 * capacity)


class FlatVectors:
    """Rows scanned exactly; removal moves the last row into the gap."""

    kind = "flat"

    def __init__(self, dim: int, ids: Sequence[str] = (), rows: Matrix | None = None) -> None:
        self.dim = dim
        self._keys: list[str] = list(ids)
        self._rows: Matrix = np.empty((0, dim), np.float32) if rows is None else np.ascontiguousarray(rows,
                                                                                                      np.float32)
        self._row_of = {vector_id: row for row, vector_id in enumerate(self._keys)}

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def capacity(self) -> int:
        return int(self._rows.shape[0])

    @property
    def nbytes(self) -> int:
        return self.nbytes_at(self.capacity)

    def nbytes_at(self, capacity: int) -> int:
        return FLAT_FIXED_BYTES + capacity * self.dim * 4

    def rows(self) -> tuple[list[str], Matrix]:
        """The ids and their rows, in row order."""
        return list(self._keys), self._rows[: len(self._keys)]

    def add(self, ids: Sequence[str], vectors: Matrix) -> None:
        count = len(self._keys)
        capacity = grown(self.capacity, count + len(ids))
        if capacity != self.capacity:
            rows = np.empty((capacity, self.dim), np.float32)
            rows[:count] = self._rows[:count]
            self._rows = rows
        self._rows[count : count + len(ids)] = vectors
        for offset, vector_id in enumerate(ids):
            self._row_of[vector_id] = count + offset
            self._keys.append(vector_id)

    def remove(self, vector_id: str) -> None:
        row = self._row_of.pop(vector_id)
        last = len(self._keys) - 1
        if row != last:
            moved = self._keys[last]
            self._rows[row] = self._rows[last]
            self._keys[row] = moved
            self._row_of[moved] = row
        self._keys.pop()

    def nearest(self, vector: Matrix, k: int) -> list[tuple[str, float]]:
        count = len(self._keys)
        if count == 0 or k < 1:
            return []
        scores = self._rows[:count] @ np.asarray(vector, np.float32).reshape(self.dim)
        top = min(k, count)
        best = np.argpartition(-scores, top - 1)[:top]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(self._keys[int(row)], float(scores[row])) for row in best]

    def save(self, path: Path) -> None:
        """The rows in use, as a ``.npy`` file (ids are the caller's to keep, in :meth:`rows` order)."""
        with path.open("wb") as file:
            np.save(file, self._rows[: len(self._keys)], allow_pickle=False)

    @classmethod
    def load(cls, path: Path, dim: int, ids: Sequence[str]) -> FlatVectors:
        rows = np.load(path, allow_pickle=False)
        if rows.shape != (len(ids), dim):
            raise ValueError(f"{path.name}: {rows.shape} rows for {len(ids)} ids of {dim} dimensions")
        return cls(dim, ids, rows)


class GraphVectors:
    """An hnswlib index; labels are handed out in order, never reused (a replaced id gets a fresh one), and the slots
    of deleted labels are reused (``allow_replace_deleted``)."""

    kind = "graph"

    def __init__(self, index: hnswlib.Index, dim: int, m: int, ef_search: int, labels: dict[str, int] | None = None,
                 next_label: int = 0) -> None:
        self.index = index
        self.dim, self.m, self.ef_search = dim, m, ef_search
        self.labels: dict[str, int] = dict(labels or {})
        self.ids = {label: vector_id for vector_id, label in self.labels.items()}
        self.next_label = next_label
        self.deleted = index.get_current_count() - len(self.labels)
        """Slots marked deleted and not yet reused."""

    @classmethod
    def empty(cls, dim: int, capacity: int, m: int, ef_construction: int, ef_search: int) -> GraphVectors:
        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=max(1, capacity), M=m, ef_construction=ef_construction,
                         allow_replace_deleted=True)
        index.set_num_threads(1)
        return cls(index, dim, m, ef_search)

    @classmethod
    def built(cls, flat: FlatVectors, capacity: int, m: int, ef_construction: int, ef_search: int) -> GraphVectors:
        """A graph of ``flat``'s rows, with room for ``capacity`` (seconds for thousands of rows: run off the event
        loop; hnswlib releases the GIL)."""
        graph = cls.empty(flat.dim, capacity, m, ef_construction, ef_search)
        ids, rows = flat.rows()
        if ids:
            graph.add(ids, rows)
        return graph

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def capacity(self) -> int:
        return int(self.index.get_max_elements())

    @property
    def nbytes(self) -> int:
        return self.nbytes_at(self.capacity)

    def nbytes_at(self, capacity: int) -> int:
        return GRAPH_FIXED_BYTES + capacity * graph_slot_bytes(self.dim, self.m)

    def add(self, ids: Sequence[str], vectors: Matrix) -> None:
        labels = np.arange(self.next_label, self.next_label + len(ids), dtype=np.int64)
        self.next_label += len(ids)
        reused = min(len(ids), self.deleted)
        self.deleted -= reused
        needed = self.index.get_current_count() + len(ids) - reused
        if needed > self.capacity:
            self.index.resize_index(grown(self.capacity, needed))
        self.index.add_items(np.asarray(vectors, np.float32), labels, replace_deleted=True)
        for label, vector_id in zip(labels.tolist(), ids, strict=True):
            self.labels[vector_id] = label
            self.ids[label] = vector_id

    def remove(self, vector_id: str) -> None:
        label = self.labels.pop(vector_id)
        del self.ids[label]
        self.index.mark_deleted(label)
        self.deleted += 1

    def nearest(self, vector: Matrix, k: int) -> list[tuple[str, float]]:
        wanted = min(k, len(self.labels))
        if wanted < 1:
            return []
        query = np.asarray(vector, np.float32).reshape(1, self.dim)
        self.index.set_ef(max(self.ef_search, wanted))
        while wanted > 0:
            try:
                labels, distances = self.index.knn_query(query, k=wanted)
                break
            except RuntimeError:  # fewer reachable live vectors than asked (deletions): ask for fewer
                wanted -= 1
        else:
            return []
        return [(self.ids[int(label)], float(1.0 - distance))
                for label, distance in zip(labels[0], distances[0], strict=True) if int(label) in self.ids]

    def save(self, path: Path) -> None:
        """hnswlib's own file (the caller keeps :attr:`labels` and :attr:`next_label`)."""
        self.index.save_index(str(path))

    @classmethod
    def load(cls, path: Path, dim: int, m: int, ef_search: int, labels: dict[str, int],
             next_label: int) -> GraphVectors:
        index = hnswlib.Index(space="ip", dim=dim)
        index.load_index(str(path), allow_replace_deleted=True)
        index.set_num_threads(1)
        return cls(index, dim, int(getattr(index, "M", m)), ef_search, labels, next_label)
