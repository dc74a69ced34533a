"""Embedded vector store: partitions that cost what they hold, within one byte budget, persisted to a directory.

A partition exists only while it holds vectors: the first add creates it, the delete of its last vector frees it.
Its vectors are an exact scan while small and an hnswlib graph past :data:`~tiers.vectors.partitions.GRAPH_FROM`
rows (:mod:`tiers.vectors.partitions`: why an ``hnswlib.Index`` per partition cost 2.6 MB each); each vector's
payload is kept as its JSON bytes and decoded only for the hits a search returns.

**Budget** (``max_bytes``, ``cache.l2.max_bytes``): what a partition holds is counted as its vectors' bytes (by
capacity), its payloads and ids, and a fixed overhead per entry and per partition (:data:`ENTRY_BYTES`,
:data:`PARTITION_BYTES`, measured with tracemalloc); the store's total never exceeds the budget. An add that would
exceed it first evicts whole partitions, least recently used (searched or added to) first, of the owner holding the
most bytes (:class:`~tiers.budgets.OwnedLRU`; ``owner`` names a partition's owner: the semantic tier's tenant). When
that owner's only partition is the one being added to, its oldest entries go instead (their slots are reused, so
the partition stops growing). An entry larger than the whole budget is refused.

**Persistence**: only :meth:`HnswVectorStore.persist` and :meth:`HnswVectorStore.load` (file I/O) and the build of
a graph from a grown scan go to a worker thread, under a lock that also serializes writers, so a partition is never
changed while it is saved or rebuilt; searches run on the event loop. Directory layout (``directory``)::

    manifest.json     {"format": "vectors2", "dim": 384, "model": "...",
                       "partitions": [[name, stem, last use], ...]}
    <stem>.npy        a scan's rows (numpy ``.npy``)           or   <stem>.index   hnswlib's save_index
    <stem>.json       {"ids": [...], "payloads": [JSON text, ...], "labels": [...] (graph), "next_label": n}

``stem`` is the first 32 hex digits of sha256(partition name). Only partitions changed since the last persist are
written; files are written under a temporary name and renamed, manifest last, so every file is whole after a crash;
files of partitions no longer held are removed. **Reload** reads partitions most recently used first and stops
taking them at the budget: what a restart brings back fits it, whatever the directory holds. A manifest of another
format, ``dim`` or ``model`` is ignored (the index starts empty: vectors of another model are not comparable, and
an ``hnsw1`` directory held one 2.6 MB index per partition), and so is a partition whose files are unreadable.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from tiers.budgets import MemoryAccount, OwnedLRU
from tiers.vectors.base import Payload, VectorHit, check_batch
from tiers.vectors.partitions import (
    GRAPH_FIXED_BYTES,
    GRAPH_FROM,
    FlatVectors,
    GraphVectors,
    graph_slot_bytes,
    grown,
)

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "vectors2"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""``cache.l2.max_bytes``: about 100,000 questions at 384 dimensions."""
ENTRY_BYTES = 200
"""Per entry, beyond its id's and payload's characters: the id and payload objects and their places in the store's
maps (tracemalloc, ``tests/tiers/vectors/test_vector_budget.py``)."""
PARTITION_BYTES = 700
"""Per partition, empty: its name, maps and recency (tracemalloc, same test)."""


def _stem(partition: str) -> str:
    return hashlib.sha256(partition.encode()).hexdigest()[:32]


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _one_owner(partition: str) -> str:
    return ""


@dataclass(slots=True)
class _Partition:
    name: str
    vectors: FlatVectors | GraphVectors
    payloads: dict[str, str]
    """Id → payload JSON, oldest first (the order entries are trimmed in)."""
    entry_bytes: int = 0
    dirty: bool = True
    used: int = 0
    """When it was last searched or added to (the store's clock of uses)."""

    @property
    def nbytes(self) -> int:
        return PARTITION_BYTES + self.vectors.nbytes + self.entry_bytes


def _entry_bytes(vector_id: str, payload: str) -> int:
    return ENTRY_BYTES + len(vector_id) + len(payload)


class HnswVectorStore:
    """Vectors in partitions within ``max_bytes``, optionally persisted to ``directory`` (module docstring)."""

    name = "hnsw"

    def __init__(
        self,
        dim: int,
        directory: Path | None = None,
        *,
        model: str = "",
        max_bytes: int = DEFAULT_MAX_BYTES,
        owner: Callable[[str], str] = _one_owner,
        graph_from: int = GRAPH_FROM,
        m: int = 16,
        ef_construction: int = 100,
        ef_search: int = 64,
    ) -> None:
        """``dim``: vector length; ``directory``: where :meth:`persist` writes and :meth:`load` reads (``None``:
        memory only); ``model``: embedder name recorded in the manifest; ``max_bytes``: the budget; ``owner``: a
        partition's owner, whose partitions go first when it holds the most; ``graph_from``: rows from which a
        partition is an hnswlib graph; ``m``/``ef_construction``/``ef_search``: hnswlib parameters."""
        self.dim = dim
        self.directory = directory
        self.model = model
        self.max_bytes = max_bytes
        self.owner = owner
        self.graph_from = max(1, graph_from)
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self._partitions: dict[str, _Partition] = {}
        self._where: dict[str, _Partition] = {}  # id -> its partition
        self._budget: OwnedLRU[str] = OwnedLRU()
        self._clock = 0
        self._lock = asyncio.Lock()
        self.evicted_partitions = 0
        """Partitions evicted whole to keep within the budget."""
        self.trimmed = 0
        """Entries evicted from a partition that had to make room for itself."""
        self.refused = 0
        """Entries larger than the whole budget, not added."""

    @property
    def nbytes(self) -> int:
        """What the partitions hold (the figure kept within :attr:`max_bytes`)."""
        return self._budget.bytes

    def memory(self) -> list[MemoryAccount]:
        return [MemoryAccount("l2_index", self.nbytes, self.max_bytes, len(self._where), "cache.l2.max_bytes")]

    def partitions(self) -> int:
        return len(self._partitions)

    def _tick(self, part: _Partition) -> None:
        self._clock += 1
        part.used = self._clock
        self._budget.touch(part.name)

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
        # str, not orjson's bytes: those keep orjson's 4 KB output buffer whatever they hold
        encoded = [orjson.dumps(dict(p)).decode() for p in payloads] if payloads is not None else ["{}"] * len(ids)
        async with self._lock:
            for vector_id in ids:  # a replaced vector is added afresh (its partition may change)
                self._delete_one(vector_id)
            part = self._partitions.get(partition) or _Partition(partition, FlatVectors(self.dim), {})
            fresh = sum(_entry_bytes(i, p) for i, p in zip(ids, encoded, strict=True))
            if not self._make_room(part, len(ids), fresh):
                self.refused += len(ids)
                return
            live = len(part.vectors) + len(ids)
            if isinstance(part.vectors, FlatVectors) and live > max(self.graph_from, part.vectors.capacity):
                part.vectors = await asyncio.to_thread(GraphVectors.built, part.vectors, grown(part.vectors.capacity,
                                                       live), self.m, self.ef_construction, self.ef_search)
            part.vectors.add(ids, vectors)
            for vector_id, payload in zip(ids, encoded, strict=True):
                part.payloads[vector_id] = payload
                self._where[vector_id] = part
            part.entry_bytes += fresh
            part.dirty = True
            if partition not in self._partitions:
                self._partitions[partition] = part
                self._budget.set(partition, self.owner(partition), part.nbytes)
            else:
                self._budget.resize(partition, part.nbytes)
            self._tick(part)

    def _bytes_after(self, part: _Partition, count: int, fresh: int) -> int:
        """What ``part`` would hold with ``count`` more entries of ``fresh`` bytes in all."""
        vectors, live = part.vectors, len(part.vectors) + count
        if isinstance(vectors, FlatVectors) and live > max(self.graph_from, vectors.capacity):
            held = GRAPH_FIXED_BYTES + grown(vectors.capacity, live) * graph_slot_bytes(self.dim, self.m)
        else:
            held = vectors.nbytes_at(grown(vectors.capacity, live))
        return PARTITION_BYTES + held + part.entry_bytes + fresh

    def _make_room(self, part: _Partition, count: int, fresh: int) -> bool:
        """Evict until ``part`` can take ``count`` entries of ``fresh`` bytes within the budget (module docstring);
        whether it can."""
        while self._budget.bytes - self._budget.size(part.name) + self._bytes_after(part, count, fresh) \
                > self.max_bytes:
            victim = self._budget.victim(keep=part.name)
            if victim is not None:
                self._drop_partition(self._partitions[victim])
                self.evicted_partitions += 1
            elif part.payloads:
                self._delete_one(next(iter(part.payloads)), keep_empty=True)
                self.trimmed += 1
            else:
                return False
        return True

    async def search(self, partition: str, vector: npt.NDArray[np.float32], k: int = 1) -> list[VectorHit]:
        part = self._partitions.get(partition)
        if part is None or k < 1:
            return []
        self._tick(part)
        return [VectorHit(vector_id, similarity, orjson.loads(part.payloads[vector_id]))
                for vector_id, similarity in part.vectors.nearest(vector, k)]

    async def delete(self, ids: Sequence[str]) -> int:
        async with self._lock:
            return sum(self._delete_one(vector_id) for vector_id in ids)

    def _delete_one(self, vector_id: str, *, keep_empty: bool = False) -> bool:
        """Remove one entry; its partition goes with its last entry unless ``keep_empty``."""
        part = self._where.pop(vector_id, None)
        if part is None:
            return False
        part.vectors.remove(vector_id)
        part.entry_bytes -= _entry_bytes(vector_id, part.payloads.pop(vector_id))
        part.dirty = True
        if part.payloads or keep_empty:
            if part.name in self._budget:
                self._budget.resize(part.name, part.nbytes)
        else:
            self._drop_partition(part)
        return True

    def _drop_partition(self, part: _Partition) -> int:
        """Forget a whole partition; the entries it held."""
        self._partitions.pop(part.name, None)
        self._budget.remove(part.name)
        for vector_id in part.payloads:
            self._where.pop(vector_id, None)
        return len(part.payloads)

    async def delete_partition(self, partition: str) -> int:
        async with self._lock:
            part = self._partitions.get(partition)
            return self._drop_partition(part) if part is not None else 0

    async def count(self, partition: str | None = None) -> int:
        if partition is None:
            return len(self._where)
        part = self._partitions.get(partition)
        return len(part.payloads) if part is not None else 0

    async def persist(self) -> None:
        if self.directory is None:
            return
        async with self._lock:
            held = list(self._partitions.values())
            await asyncio.to_thread(self._persist_sync, self.directory, held)

    def _persist_sync(self, directory: Path, held: list[_Partition]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for part in held:
            if part.dirty:
                self._save_partition(directory, part)
                part.dirty = False
        listed = [[part.name, _stem(part.name), part.used] for part in sorted(held, key=lambda p: p.used)]
        manifest = {"format": FORMAT, "dim": self.dim, "model": self.model, "partitions": listed}
        _write_atomically(directory / MANIFEST, json.dumps(manifest).encode())
        live = {stem for _, stem, _ in listed}
        for stale in directory.iterdir():
            if stale.suffix in (".index", ".json", ".npy", ".tmp") and stale.name != MANIFEST \
                    and stale.name.split(".", 1)[0] not in live:
                stale.unlink(missing_ok=True)

    @staticmethod
    def _save_partition(directory: Path, part: _Partition) -> None:
        stem = _stem(part.name)
        vectors = part.vectors
        meta: dict[str, Any] = {"payloads": part.payloads}
        if isinstance(vectors, FlatVectors):
            meta["ids"] = vectors.rows()[0]
            vectors.save(directory / f"{stem}.npy.tmp")
            os.replace(directory / f"{stem}.npy.tmp", directory / f"{stem}.npy")
            (directory / f"{stem}.index").unlink(missing_ok=True)
        else:
            meta.update(labels=vectors.labels, next_label=vectors.next_label)
            vectors.save(directory / f"{stem}.index.tmp")
            os.replace(directory / f"{stem}.index.tmp", directory / f"{stem}.index")
            (directory / f"{stem}.npy").unlink(missing_ok=True)
        _write_atomically(directory / f"{stem}.json", orjson.dumps(meta))

    async def load(self) -> int:
        """Replace the contents with what ``directory`` holds, most recently used first, up to the budget; the number
        of vectors loaded."""
        if self.directory is None:
            return 0
        async with self._lock:
            loaded = await asyncio.to_thread(self._load_sync, self.directory)
            self._partitions, self._where, self._budget = {}, {}, OwnedLRU()
            for part in sorted(loaded, key=lambda p: p.used):  # least recently used first: the budget's order
                self._partitions[part.name] = part
                self._budget.set(part.name, self.owner(part.name), part.nbytes)
                self._where.update((vector_id, part) for vector_id in part.payloads)
            self._clock = max((part.used for part in loaded), default=0)
            return len(self._where)

    def _load_sync(self, directory: Path) -> list[_Partition]:
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            return []
        expected = (FORMAT, self.dim, self.model)
        found = (manifest.get("format"), manifest.get("dim"), manifest.get("model"))
        if found != expected:
            log.warning("ignoring vector index in %s: %s, expected %s", directory, found, expected)
            return []
        try:
            listed = sorted(((str(name), str(stem), int(used)) for name, stem, used in manifest["partitions"]),
                            key=lambda row: row[2], reverse=True)
        except (KeyError, TypeError, ValueError) as error:
            log.warning("ignoring vector index in %s: its manifest lists no partitions (%r)", directory, error)
            return []
        loaded: list[_Partition] = []
        total = skipped = 0
        for name, stem, used in listed:
            try:
                if total + self._estimate(directory, stem) > self.max_bytes:
                    skipped += 1
                    continue
                part = self._load_partition(directory, name, stem, used)
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
                log.warning("ignoring partition %r in %s: %r", name, directory, error)
                continue
            if total + part.nbytes > self.max_bytes:
                skipped += 1
                continue
            total += part.nbytes
            loaded.append(part)
        if skipped:
            log.warning("vector index in %s: %d least recently used partitions left out (cache.l2.max_bytes)",
                        directory, skipped)
        return loaded

    @staticmethod
    def _estimate(directory: Path, stem: str) -> int:
        """A partition's size from its files, before reading them (a graph adds its fixed cost)."""
        graph = directory / f"{stem}.index"
        if graph.exists():
            return GRAPH_FIXED_BYTES + graph.stat().st_size + (directory / f"{stem}.json").stat().st_size
        return (directory / f"{stem}.npy").stat().st_size + (directory / f"{stem}.json").stat().st_size

    def _load_partition(self, directory: Path, name: str, stem: str, used: int) -> _Partition:
        meta = orjson.loads((directory / f"{stem}.json").read_bytes())
        payloads = {str(i): str(p) for i, p in meta["payloads"].items()}
        vectors: FlatVectors | GraphVectors
        if "labels" in meta:
            labels = {str(i): int(label) for i, label in meta["labels"].items()}
            vectors = GraphVectors.load(directory / f"{stem}.index", self.dim, self.m, self.ef_search, labels,
                                        int(meta["next_label"]))
        else:
            vectors = FlatVectors.load(directory / f"{stem}.npy", self.dim, [str(i) for i in meta["ids"]])
        if set(payloads) != (set(vectors.labels) if isinstance(vectors, GraphVectors) else set(meta["ids"])):
            raise ValueError("ids and payloads differ")
        part = _Partition(name, vectors, payloads, dirty=False, used=used)
        part.entry_bytes = sum(_entry_bytes(i, p) for i, p in payloads.items())
        return part

    async def close(self) -> None:
        await self.persist()
