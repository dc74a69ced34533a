"""Shared vector store: one Qdrant collection, partitions as a payload filter.

Layout: collection ``collection`` (default ``ragproxy_semantic``), cosine distance, created on the first
write together with a keyword payload index on ``partition``. Each point is::

    id       uuid5(NAMESPACE, <store id>)      (Qdrant ids must be integers or UUIDs)
    vector   the unit vector
    payload  {"partition": <partition>, "key": <store id>, "data": <caller's payload>}

Searches filter on ``partition`` (must match exactly) and return Qdrant's cosine score as the similarity.
Re-adding an id overwrites its point, moving it when the partition differs. Qdrant is durable by itself, so
:meth:`QdrantVectorStore.persist` does nothing. Qdrant calls are awaited directly (``AsyncQdrantClient``);
failures propagate and the semantic tier counts them as misses.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from qdrant_client import AsyncQdrantClient, models

from tiers.vectors.base import Payload, VectorHit, check_batch

NAMESPACE = uuid.UUID("6f1d3c52-9a43-4c1e-8f5e-2b7a1c0d9e11")
"""uuid5 namespace of point ids; fixed forever (changing it orphans every stored point)."""


def point_id(vector_id: str) -> str:
    """The Qdrant point id of a store id."""
    return str(uuid.uuid5(NAMESPACE, vector_id))


def _partition_filter(partition: str) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key="partition", match=models.MatchValue(value=partition))])


class QdrantVectorStore:
    """Partitions of unit vectors in one Qdrant collection."""

    name = "qdrant"

    def __init__(self, client: AsyncQdrantClient, dim: int, *, collection: str = "ragproxy_semantic") -> None:
        """``client``: an open ``AsyncQdrantClient`` (owned by the caller unless :meth:`close` is called);
        ``dim``: vector length; ``collection``: the collection to use, created on demand."""
        self.client = client
        self.dim = dim
        self.collection = collection
        self._ready = False

    async def _exists(self) -> bool:
        if not self._ready:
            self._ready = await self.client.collection_exists(self.collection)
        return self._ready

    async def _ensure_collection(self) -> None:
        if await self._exists():
            return
        try:
            await self.client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(size=self.dim, distance=models.Distance.COSINE),
            )
        except Exception:  # another proxy replica created it first
            if not await self.client.collection_exists(self.collection):
                raise
        await self.client.create_payload_index(
            self.collection, "partition", field_schema=models.PayloadSchemaType.KEYWORD
        )
        self._ready = True

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
        await self._ensure_collection()
        points = [
            models.PointStruct(
                id=point_id(vector_id),
                vector=vectors[position].tolist(),
                payload={
                    "partition": partition,
                    "key": vector_id,
                    "data": dict(payloads[position]) if payloads is not None else {},
                },
            )
            for position, vector_id in enumerate(ids)
        ]
        await self.client.upsert(self.collection, points=points, wait=True)

    async def search(self, partition: str, vector: npt.NDArray[np.float32], k: int = 1) -> list[VectorHit]:
        if k < 1 or not await self._exists():
            return []
        response = await self.client.query_points(
            self.collection,
            query=np.asarray(vector, dtype=np.float32).reshape(self.dim).tolist(),
            query_filter=_partition_filter(partition),
            limit=k,
            with_payload=True,
        )
        hits = []
        for point in response.points:
            payload: dict[str, Any] = point.payload or {}
            hits.append(VectorHit(str(payload.get("key")), float(point.score), dict(payload.get("data") or {})))
        return hits

    async def delete(self, ids: Sequence[str]) -> int:
        if not ids or not await self._exists():
            return 0
        points: list[models.ExtendedPointId] = [point_id(vector_id) for vector_id in dict.fromkeys(ids)]
        existing = await self.client.retrieve(self.collection, points, with_payload=False)
        if existing:
            selector = models.PointIdsList(points=[record.id for record in existing])
            await self.client.delete(self.collection, points_selector=selector, wait=True)
        return len(existing)

    async def delete_partition(self, partition: str) -> int:
        if not await self._exists():
            return 0
        removed = await self.count(partition)
        selector = models.FilterSelector(filter=_partition_filter(partition))
        await self.client.delete(self.collection, points_selector=selector, wait=True)
        return removed

    async def count(self, partition: str | None = None) -> int:
        if not await self._exists():
            return 0
        count_filter = _partition_filter(partition) if partition is not None else None
        result = await self.client.count(self.collection, count_filter=count_filter, exact=True)
        return int(result.count)

    async def persist(self) -> None:
        """Nothing to do: Qdrant persists by itself."""

    async def close(self) -> None:
        await self.client.close()
