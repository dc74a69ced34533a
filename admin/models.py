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


DURATION = r"^[1-9][0-9]{0,3}(s|m|h|d|mo)$"
"""A period: ``<n>`` seconds, minutes, hours, days or months (``proxy.rate_limits.decisions``)."""
LATEST_EXPIRY = 4_102_444_800.0
"""2100-01-01: the latest ``expires_at`` accepted (epoch seconds)."""


class LimitsBody(_Body):
    """Limits of a key, user or tenant. In a ``PATCH`` an absent field stays as it is and ``null`` removes it; in a
    ``PUT`` an absent field is removed."""

    rpm_limit: int | None = Field(default=None, ge=1, le=10**9, description="Requests per minute")
    tpm_limit: int | None = Field(default=None, ge=1, le=10**12, description="Tokens per minute (prompt and "
                                  "completion tokens the upstream processed; estimated at arrival, settled with the "
                                  "usage when credits are on)")
    max_budget: Decimal | None = Field(default=None, gt=0, le=Decimal(10) ** 9, strict=False,
                                       description="Credits that may be charged per budget_duration (in all, "
                                       "without one; needs credits.enabled)")
    budget_duration: str | None = Field(default=None, pattern=DURATION, description="The budget's period, a fixed "
                                        "window in UTC: <n>s, <n>m, <n>h, <n>d (1d: from midnight UTC) or <n>mo "
                                        "(1mo: from the first of the month)")


class KeyCreateBody(LimitsBody):
    user: str = Field(min_length=1, max_length=200)
    tenant: str = Field(default="default", min_length=1, max_length=200)
    name: str = Field(default="", max_length=200)
    expires_at: float | None = Field(default=None, gt=0, le=LATEST_EXPIRY, strict=False,
                                     description="When the key stops working (epoch seconds)")
    duration: str | None = Field(default=None, pattern=DURATION, description="Or: how long the key works from now "
                                 "(<n>s, <n>m, <n>h, <n>d, <n>mo)")


class KeyPatchBody(LimitsBody):
    """A key's changes (absent: unchanged; ``null``: removed)."""

    name: str | None = Field(default=None, max_length=200)
    expires_at: float | None = Field(default=None, gt=0, le=LATEST_EXPIRY, strict=False,
                                     description="When the key stops working (epoch seconds; null: never)")
    duration: str | None = Field(default=None, pattern=DURATION, description="Or: how long the key works from now")


class TopUpBody(_Body):
    amount: Decimal = Field(gt=0, le=Decimal(10) ** 9, strict=False, description="Credits to add (decimal)")
    tenant: str = Field(default="default", min_length=1, max_length=200)
    note: str = Field(default="", max_length=500)
