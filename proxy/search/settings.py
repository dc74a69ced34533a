"""The search cache's settings, ``cache.retrieval`` (composed into :class:`proxy.answers.settings.CacheSettings`)."""

from __future__ import annotations

from pydantic import Field

from proxy.core.settings_section import PolicyName, Section


class RetrievalSettings(Section):
    enabled: bool = Field(default=True, description="Reuse Qdrant search results for equal or nearby query vectors")
    tolerance: float = Field(default=0.015, ge=0, description="Default cosine distance (1 - cos) for a reuse")
    collection_tolerances: dict[str, float] = Field(
        default_factory=dict, description="Per collection, in the collection's own metric"
    )
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="Memory for cached search results")
    policy: PolicyName = Field(default="lru", description="Eviction policy of the search cache")
    ttl_s: float | None = Field(
        default=300.0, gt=0, description="Lifetime of a cached search: bounds how long a change made directly in "
        "Qdrant (not through the proxy) can go unseen (none: until a write through the proxy; see operations.md)"
    )
