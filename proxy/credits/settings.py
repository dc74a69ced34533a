"""The ``credits`` settings section: prices, hit multipliers and the credit store's behaviour in an outage. Composed
into :class:`proxy.assembly.config.Settings`; its defaults are defined here once (:mod:`proxy.credits.pricing` reads
them)."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import Field

from proxy.core.settings_section import Section


class ModelPriceSettings(Section):
    prompt_per_1k: Decimal = Field(description="Credits per 1,000 prompt tokens")
    completion_per_1k: Decimal = Field(description="Credits per 1,000 completion tokens")
    cached_prompt_per_1k: Decimal | None = Field(default=None, description="Rate for backend-cached prompt tokens")
    context_tokens: int = Field(default=32_768, ge=1, description="Context size, bounds the worst case")
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Longest completion the model gives")


_HIT_MULTIPLIER = Decimal("0.1")


def _default_multipliers() -> dict[str, Decimal]:
    return {tier: _HIT_MULTIPLIER for tier in ("l1", "l2", "l3", "retrieval", "coalesced")}


class CreditsSettings(Section):
    enabled: bool = Field(default=False, description="Charge every request to the user behind its API key")
    store: Literal["auto", "sqlite", "redis"] = Field(default="auto", description="auto: redis when redis.url is set")
    sqlite_synchronous: Literal["FULL", "NORMAL"] = Field(
        default="FULL", description="FULL: entries survive a power cut; NORMAL: about 10x faster, survives crashes"
    )
    models: dict[str, ModelPriceSettings] = Field(default_factory=dict, description="Prices per model name")
    default_prompt_per_1k: Decimal = Field(default=Decimal("0.001"), ge=0)
    default_completion_per_1k: Decimal = Field(default=Decimal("0.002"), ge=0)
    search_price: Decimal = Field(default=Decimal("0.0001"), ge=0, description="Credits per vector search")
    rerank_price: Decimal = Field(default=Decimal("0.00002"), ge=0, description="Credits per document reranked")
    request_price: Decimal = Field(
        default=Decimal("0.0001"), ge=0, description="Credits per forwarded request that has no price of its own "
        "(upstreams.llm_passthrough requests; Qdrant requests other than searches)"
    )
    hit_multipliers: dict[str, Decimal] = Field(
        default_factory=_default_multipliers, description="Share of the full price a cache hit costs, per tier"
    )
    default_hit_multiplier: Decimal = Field(
        default=_HIT_MULTIPLIER, ge=0, description="Share of the full price a hit of a tier absent from "
        "hit_multipliers costs"
    )
    reservation_ttl_s: float = Field(default=600.0, gt=0, description="A reservation of a dead proxy is reaped after")
    fail_open: bool = Field(default=False, description="Serve unbilled when the credit store is down (else 503)")
    allow_volatile_redis: bool = Field(
        default=False, description="Start even when credits live in a Redis that persists nothing (a restart "
        "erases every balance; logged as an error); by default such a start is refused"
    )
    outage_allowance: Decimal = Field(
        default=Decimal("1"), ge=0,
        description="Credits a user may spend per replica while the credit store is down, within the last known "
        "balance; settlements are journaled under data_dir and replayed (0: 503 at once)",
    )
    journal_replay_interval_s: float = Field(
        default=1.0, gt=0, description="How often settlements journaled during a credit store outage are retried"
    )
