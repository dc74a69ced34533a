"""Vector stores for the semantic tier: the contract (:mod:`tiers.vectors.base`), hnswlib and Qdrant."""

from __future__ import annotations

from tiers.vectors.base import VectorHit, VectorStore
from tiers.vectors.hnsw import HnswVectorStore
from tiers.vectors.qdrant import QdrantVectorStore

__all__ = ["HnswVectorStore", "QdrantVectorStore", "VectorHit", "VectorStore"]
