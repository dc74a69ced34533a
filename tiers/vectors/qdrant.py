"""Shared vector store: one Qdrant collection, partitions as a payload filter, over Qdrant's REST API.

Layout: collection ``collection`` (default ``ragproxy_semantic``), cosine distance, created on the first
write together with a keyword payload index on ``partition``. Each point is::

    id       uuid5(NAMESPACE, <store id>)      (Qdrant ids must be integers or UUIDs)
    vector   the unit vector
    payload  {"partition": <partition>, "key": <store id>, "data": <caller's payload>}

Searches filter on ``partition`` (must match exactly) and return Qdrant's cosine score as the similarity.
Re-adding an id overwrites its point, moving it when the partition differs. Qdrant is durable by itself, so
:meth:`QdrantVectorStore.persist` does nothing. Failures propagate (:class:`QdrantError` for an error answer,
``OSError`` when Qdrant cannot be reached) and the semantic tier counts them as misses.

Why REST through the proxy's own client (passed as a :class:`~tiers.fetch.Fetcher`) rather than qdrant-client:
the store needs eight plain JSON calls, and qdrant-client would bring a second HTTP stack (httpx, and gRPC) into
the product for them; with one client, Qdrant calls share its pools, timeouts and failure handling.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from tiers.fetch import Fetcher
from tiers.vectors.base import Payload, VectorHit, check_batch

NAMESPACE = uuid.UUID("6f1d3c52-9a43-4c1e-8f5e-2b7a1c0d9e11")
QDRANT_CALL_S = 5.0
"""Bound on one call to Qdrant, by default."""
"""uuid5 namespace of point ids; fixed forever (changing it orphans every stored point)."""


class QdrantError(RuntimeError):
    """Qdrant answered a call with an error status."""


def point_id(vector_id: str) -> str:
    """The Qdrant point id of a store id."""
    return str(uuid.uuid5(NAMESPACE, vector_id))


def _partition_filter(partition: str) -> dict[str, Any]:
    return {"must": [{"key": "partition", "match": {"value": partition}}]}


class QdrantVectorStore:
    """Partitions of unit vectors in one Qdrant collection."""

    name = "qdrant"

    def __init__(self, client: Fetcher, url: str, dim: int, *, collection: str = "ragproxy_semantic",
                 api_key: str | None = None, timeout_s: float = QDRANT_CALL_S) -> None:
        """``client``: the HTTP client (not closed here); ``url``: Qdrant's base URL; ``dim``: vector length;
        ``collection``: the collection to use, created on demand; ``timeout_s``: bound on one call."""
        self.client = client
        self.dim = dim
        self.collection = collection
        self._base = f"{url.rstrip('/')}/collections/{collection}"
        self._headers = {"Content-Type": "application/json", **({"api-key": api_key} if api_key else {})}
        self._timeout_s = timeout_s
        self._ready = False

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        """Qdrant's ``result`` for one call."""
        answer = await self.client.fetch(
            method, self._base + path, headers=self._headers,
            body=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY) if body is not None else None,
            timeout_s=self._timeout_s, idempotent=True,  # every call here can be repeated without harm
        )
        if answer.status >= 300:
            raise QdrantError(f"Qdrant answered {answer.status}: {answer.body[:200].decode('utf-8', 'replace')}")
        return answer.json().get("result")

    async def _exists(self) -> bool:
        if not self._ready:
            found = await self._call("GET", "/exists")
            self._ready = bool(found and found.get("exists"))
        return self._ready

    async def _ensure_collection(self) -> None:
        if await self._exists():
            return
        try:
            await self._call("PUT", "", {"vectors": {"size": self.dim, "distance": "Cosine"}})
        except QdrantError:  # another proxy replica created it first
            if not await self._exists():
                raise
        await self._call("PUT", "/index?wait=true", {"field_name": "partition", "field_schema": "keyword"})
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
            {
                "id": point_id(vector_id),
                "vector": vectors[position],
                "payload": {
                    "partition": partition,
                    "key": vector_id,
                    "data": dict(payloads[position]) if payloads is not None else {},
                },
            }
            for position, vector_id in enumerate(ids)
        ]
        await self._call("PUT", "/points?wait=true", {"points": points})

    async def search(self, partition: str, vector: npt.NDArray[np.float32], k: int = 1) -> list[VectorHit]:
        if k < 1 or not await self._exists():
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(self.dim)
        result = await self._call("POST", "/points/query", {
            "query": query, "filter": _partition_filter(partition), "limit": k, "with_payload": True})
        hits = []
        for point in result["points"]:
            payload: dict[str, Any] = point.get("payload") or {}
            hits.append(VectorHit(str(payload.get("key")), float(point["score"]), dict(payload.get("data") or {})))
        return hits

    async def delete(self, ids: Sequence[str]) -> int:
        if not ids or not await self._exists():
            return 0
        points = [point_id(vector_id) for vector_id in dict.fromkeys(ids)]
        existing = await self._call("POST", "/points", {"ids": points, "with_payload": False, "with_vector": False})
        if existing:
            await self._call("POST", "/points/delete?wait=true", {"points": [record["id"] for record in existing]})
        return len(existing)

    async def delete_partition(self, partition: str) -> int:
        if not await self._exists():
            return 0
        removed = await self.count(partition)
        await self._call("POST", "/points/delete?wait=true", {"filter": _partition_filter(partition)})
        return removed

    async def count(self, partition: str | None = None) -> int:
        if not await self._exists():
            return 0
        body: dict[str, Any] = {"exact": True}
        if partition is not None:
            body["filter"] = _partition_filter(partition)
        result = await self._call("POST", "/points/count", body)
        return int(result["count"])

    async def persist(self) -> None:
        """Nothing to do: Qdrant persists by itself."""

    async def close(self) -> None:
        """Nothing to do: the HTTP client belongs to the caller."""
