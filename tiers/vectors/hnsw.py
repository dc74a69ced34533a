"""Embedded vector store: one hnswlib index per partition, persisted to a directory.

Each partition is an ``hnswlib.Index`` in inner-product space (vectors are unit length, so ``1 - distance``
is the cosine), created with room for ``initial_capacity`` vectors and doubled by ``resize_index`` when
full. Deletions use ``mark_deleted``; the index is built with ``allow_replace_deleted`` so later adds reuse
the slots of deleted vectors instead of growing. hnswlib labels are integers: each partition maps its string
ids to labels it hands out in order, never reusing one; replacing an id's vector deletes its label and adds
a fresh one (hnswlib's in-place update combined with slot reuse would leave a stale copy in the graph).

Index calls are microseconds on the partition sizes a semantic cache sees, so they run on the event loop;
only :meth:`HnswVectorStore.persist` and :meth:`HnswVectorStore.load` (file I/O) go to a worker thread,
under a lock that also serializes writers so that an index is never modified while it is being saved.

Directory layout (``directory``)::

    manifest.json          {"format": "hnsw1", "dim": 384, "model": "...", "partitions": {name: stem}}
    <stem>.index           hnswlib's save_index of that partition
    <stem>.json            {"labels": {id: label}, "payloads": {id: payload}, "next_label": n}

``stem`` is the first 32 hex digits of sha256(partition name). Files are written under a temporary name and
renamed, manifest last, so every file is whole after a crash mid-persist; an index that got ahead of its
metadata only holds vectors that searches skip. A manifest whose ``dim`` or ``model`` differs from the
store's is ignored (the cache starts empty: vectors of another model are not comparable), and so is a
partition whose files are missing or unreadable.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np
import numpy.typing as npt

from tiers.vectors.base import Payload, VectorHit, check_batch

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "hnsw1"


@dataclass(slots=True)
class _Partition:
    index: hnswlib.Index
    labels: dict[str, int] = field(default_factory=dict)
    ids: dict[int, str] = field(default_factory=dict)
    payloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    next_label: int = 0
    deleted: int = 0  # slots marked deleted and not yet reused


def _stem(partition: str) -> str:
    return hashlib.sha256(partition.encode()).hexdigest()[:32]


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


class HnswVectorStore:
    """hnswlib indexes, one per partition, optionally persisted to ``directory``."""

    name = "hnsw"

    def __init__(
        self,
        dim: int,
        directory: Path | None = None,
        *,
        model: str = "",
        initial_capacity: int = 64,
        m: int = 16,
        ef_construction: int = 100,
        ef_search: int = 64,
    ) -> None:
        """``dim``: vector length; ``directory``: where :meth:`persist` writes and :meth:`load` reads
        (``None``: memory only); ``model``: embedder name recorded in the manifest; ``initial_capacity``:
        slots of a new partition's index; ``m``/``ef_construction``/``ef_search``: hnswlib parameters."""
        self.dim = dim
        self.directory = directory
        self.model = model
        self.initial_capacity = max(1, initial_capacity)
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self._partitions: dict[str, _Partition] = {}
        self._where: dict[str, str] = {}  # id -> partition
        self._lock = asyncio.Lock()

    def _new_index(self, capacity: int) -> hnswlib.Index:
        index = hnswlib.Index(space="ip", dim=self.dim)
        index.init_index(
            max_elements=capacity, M=self.m, ef_construction=self.ef_construction, allow_replace_deleted=True
        )
        index.set_num_threads(1)
        return index

    async def add(
        self,
        partition: str,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        payloads: Sequence[Payload] | None = None,
    ) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        check_batch(self.dim, ids, vectors, payloads)
        if not ids:
            return
        async with self._lock:
            for vector_id in ids:  # a replaced vector gets a fresh label (see below)
                self._delete_one(vector_id)
            part = self._partitions.get(partition)
            if part is None:
                part = _Partition(self._new_index(max(self.initial_capacity, len(ids))))
                self._partitions[partition] = part
            labels = np.arange(part.next_label, part.next_label + len(ids), dtype=np.int64)
            part.next_label += len(ids)
            self._reserve(part, len(ids))
            part.index.add_items(vectors, labels, replace_deleted=True)
            for position, vector_id in enumerate(ids):
                label = int(labels[position])
                part.labels[vector_id] = label
                part.ids[label] = vector_id
                part.payloads[vector_id] = dict(payloads[position]) if payloads is not None else {}
                self._where[vector_id] = partition

    @staticmethod
    def _reserve(part: _Partition, fresh: int) -> None:
        reused = min(fresh, part.deleted)
        part.deleted -= reused
        needed = part.index.get_current_count() + fresh - reused
        capacity = part.index.get_max_elements()
        if needed > capacity:
            part.index.resize_index(max(needed, 2 * capacity))

    async def search(self, partition: str, vector: npt.NDArray[np.float32], k: int = 1) -> list[VectorHit]:
        part = self._partitions.get(partition)
        if part is None or not part.labels or k < 1:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(1, self.dim)
        wanted = min(k, len(part.labels))
        part.index.set_ef(max(self.ef_search, wanted))
        while wanted > 0:
            try:
                labels, distances = part.index.knn_query(query, k=wanted)
                break
            except RuntimeError:  # fewer reachable live vectors than asked (deletions): ask for fewer
                wanted -= 1
        else:
            return []
        hits = []
        for label, distance in zip(labels[0], distances[0], strict=True):
            vector_id = part.ids.get(int(label))
            if vector_id is None:  # an index saved ahead of its metadata by an interrupted persist
                continue
            hits.append(VectorHit(vector_id, float(1.0 - distance), dict(part.payloads[vector_id])))
        return hits

    async def delete(self, ids: Sequence[str]) -> int:
        async with self._lock:
            return sum(self._delete_one(vector_id) for vector_id in ids)

    def _delete_one(self, vector_id: str) -> bool:
        partition = self._where.pop(vector_id, None)
        if partition is None:
            return False
        part = self._partitions[partition]
        label = part.labels.pop(vector_id)
        del part.ids[label]
        del part.payloads[vector_id]
        part.index.mark_deleted(label)
        part.deleted += 1
        return True

    async def delete_partition(self, partition: str) -> int:
        async with self._lock:
            part = self._partitions.pop(partition, None)
            if part is None:
                return 0
            for vector_id in part.labels:
                del self._where[vector_id]
            return len(part.labels)

    async def count(self, partition: str | None = None) -> int:
        if partition is None:
            return len(self._where)
        part = self._partitions.get(partition)
        return len(part.labels) if part is not None else 0

    async def persist(self) -> None:
        if self.directory is None:
            return
        async with self._lock:
            await asyncio.to_thread(self._persist_sync, self.directory)

    def _persist_sync(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        stems: dict[str, str] = {}
        for name, part in self._partitions.items():
            stem = stems[name] = _stem(name)
            part.index.save_index(str(directory / f"{stem}.index.tmp"))
            os.replace(directory / f"{stem}.index.tmp", directory / f"{stem}.index")
            meta = {"labels": part.labels, "payloads": part.payloads, "next_label": part.next_label}
            _write_atomically(directory / f"{stem}.json", json.dumps(meta).encode())
        manifest = {"format": FORMAT, "dim": self.dim, "model": self.model, "partitions": stems}
        _write_atomically(directory / MANIFEST, json.dumps(manifest).encode())
        live = set(stems.values())
        for stale in directory.iterdir():
            if stale.suffix in (".index", ".json") and stale.name != MANIFEST and stale.stem not in live:
                stale.unlink(missing_ok=True)

    async def load(self) -> int:
        """Replace the contents with what ``directory`` holds; the number of vectors loaded."""
        if self.directory is None:
            return 0
        async with self._lock:
            partitions = await asyncio.to_thread(self._load_sync, self.directory)
            self._partitions = partitions
            self._where = {i: name for name, part in partitions.items() for i in part.labels}
            return len(self._where)

    def _load_sync(self, directory: Path) -> dict[str, _Partition]:
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}
        expected = (FORMAT, self.dim, self.model)
        found = (manifest.get("format"), manifest.get("dim"), manifest.get("model"))
        if found != expected:
            log.warning("ignoring vector index in %s: %s, expected %s", directory, found, expected)
            return {}
        partitions: dict[str, _Partition] = {}
        for name, stem in manifest.get("partitions", {}).items():
            try:
                partitions[name] = self._load_partition(directory, stem)
            except (OSError, ValueError, KeyError, RuntimeError) as error:
                log.warning("ignoring partition %r in %s: %r", name, directory, error)
        return partitions

    def _load_partition(self, directory: Path, stem: str) -> _Partition:
        meta = json.loads((directory / f"{stem}.json").read_text())
        index = hnswlib.Index(space="ip", dim=self.dim)
        index.load_index(str(directory / f"{stem}.index"), allow_replace_deleted=True)
        index.set_num_threads(1)
        labels = {str(i): int(label) for i, label in meta["labels"].items()}
        part = _Partition(
            index=index,
            labels=labels,
            ids={label: i for i, label in labels.items()},
            payloads={str(i): dict(p) for i, p in meta["payloads"].items()},
            next_label=int(meta["next_label"]),
        )
        part.deleted = index.get_current_count() - len(labels)
        return part

    async def close(self) -> None:
        await self.persist()
