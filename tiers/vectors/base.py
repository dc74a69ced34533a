"""The vector-store contract behind the semantic tier.

Vectors live in named **partitions** (the semantic tier uses one per tenant, namespace and context
signature); a search only ever sees its own partition. Ids are strings, unique across the whole store:
adding an id that exists replaces its vector and payload (and moves it when the partition differs), so
``delete(ids)`` needs no partition. Vectors are float32 and L2-normalized by the caller; ``similarity`` is
their cosine (dot product), highest first. Payloads are small JSON-able dicts kept next to each vector.

Backends: :class:`~tiers.vectors.hnsw.HnswVectorStore` (embedded, hnswlib, persisted to a directory) and
:class:`~tiers.vectors.qdrant.QdrantVectorStore` (shared, one Qdrant collection with a partition payload
filter). ``tests/tiers/vectors/test_vector_store_conformance.py`` is the definition of "a backend works".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Payload = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class VectorHit:
    """One search result: the stored id, its cosine similarity to the query and its payload."""

    id: str
    similarity: float
    payload: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class VectorStore(Protocol):
    """Async store of unit vectors in partitions."""

    name: str
    dim: int

    async def add(
        self,
        partition: str,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        payloads: Sequence[Payload] | None = None,
    ) -> None:
        """Insert or replace ``ids`` (rows of ``vectors``, shape ``(len(ids), dim)``) in ``partition``."""

    async def search(self, partition: str, vector: npt.NDArray[np.float32], k: int = 1) -> list[VectorHit]:
        """Up to ``k`` nearest vectors of ``partition``, most similar first; ``[]`` if it is unknown."""

    async def delete(self, ids: Sequence[str]) -> int:
        """Remove ``ids`` wherever they are; the number that existed."""

    async def delete_partition(self, partition: str) -> int:
        """Remove a whole partition; the number of vectors removed."""

    async def count(self, partition: str | None = None) -> int:
        """Live vectors in ``partition`` (in the whole store when ``None``)."""

    async def persist(self) -> None:
        """Make everything added so far durable (a no-op where the backend is durable by itself)."""

    async def close(self) -> None:
        """Persist if needed and release resources."""


def check_batch(
    dim: int, ids: Sequence[str], vectors: npt.NDArray[np.float32], payloads: Sequence[Payload] | None
) -> None:
    """Raise ``ValueError`` unless ids, vectors and payloads line up and vectors have ``dim`` columns."""
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"vectors must have shape (n, {dim}), got {vectors.shape}")
    if vectors.shape[0] != len(ids):
        raise ValueError(f"{len(ids)} ids for {vectors.shape[0]} vectors")
    if len(set(ids)) != len(ids):
        raise ValueError("ids of one add must be distinct")
    if payloads is not None and len(payloads) != len(ids):
        raise ValueError("one payload per id")
