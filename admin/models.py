"""Request bodies of the admin API, validated with pydantic (their JSON schemas feed the OpenAPI document)."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    """Strict: JSON types are not coerced (``false`` is not ``0.0``), as the OpenAPI document says."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NearBody(_Body):
    text: str = Field(min_length=1, description="Query text whose neighbours go")
    radius: float = Field(ge=0, le=2, description="Cosine distance (1 - similarity) around the query")


class InvalidateBody(_Body):
    """What to invalidate; parts combine with AND, list items with OR."""

    keys: list[str] = Field(default_factory=list, max_length=10_000)
    tenant: str | None = Field(default=None, min_length=1)
    namespace: str | None = Field(default=None, min_length=1)
    model: str | None = Field(default=None, min_length=1)
    documents: list[str] = Field(default_factory=list, max_length=10_000)
    collection: str | None = Field(
        default=None, min_length=1, description="A Qdrant collection: alone, drops every cached search of it on every "
        "replica (after a change made directly in Qdrant); with documents, the searches whose results held them")
    near: NearBody | None = None
    older_than_s: float | None = Field(default=None, ge=0)
    newer_than_s: float | None = Field(default=None, ge=0)


class VersionBumpBody(_Body):
    tenant: str = Field(min_length=1)
    namespace: str = Field(min_length=1)


class FlushBody(_Body):
    tiers: list[str] | None = Field(default=None, description="Tier names; all tiers when absent")


class KeysDeleteBody(_Body):
    """LiteLLM's ``/cache/delete`` body."""

    keys: list[str] = Field(max_length=10_000)


class KeyCreateBody(_Body):
    user: str = Field(min_length=1, max_length=200)
    tenant: str = Field(default="default", min_length=1, max_length=200)
    name: str = Field(default="", max_length=200)


class TopUpBody(_Body):
    amount: Decimal = Field(gt=0, le=Decimal(10) ** 9, strict=False, description="Credits to add (decimal)")
    tenant: str = Field(default="default", min_length=1, max_length=200)
    note: str = Field(default="", max_length=500)
