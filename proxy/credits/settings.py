"""The ``credits`` and ``idempotency`` settings sections: prices, hit multipliers, the credit store's behaviour in
an outage, and how long and how much of an idempotent call's answer is kept. Composed into
:class:`proxy.assembly.config.Settings`; their defaults are defined here once (:mod:`proxy.credits.pricing` reads
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


class IdempotencySettings(Section):
    enabled: bool = Field(default=True, description="Honour Idempotency-Key on LLM calls: a repeat gets the first "
                          "answer and is charged once")
    ttl_s: float = Field(default=86_400.0, gt=0, description="How long a finished call's answer serves repeats")
    running_ttl_s: float = Field(default=600.0, gt=0, description="Longest a key stays held by an unfinished call")
    max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=0, description="Larger answers are not kept (a "
                                    "repeat runs again)")
    max_bytes: int = Field(default=256 * 1024**2, ge=0, description="Bytes of kept answers held in all (process "
                           "memory, or Redis when redis.url is set): past it the oldest finished key of the user "
                           "holding the most goes")
    max_bytes_per_user: int = Field(default=16 * 1024**2, ge=0, description="Bytes of kept answers one user holds "
                                    "at most: past it the user's oldest finished key goes; an answer that cannot fit "
                                    "is not kept (a repeat runs again)")
    max_entries: int = Field(default=10_000, ge=1, description="Keys kept in memory in all (embedded mode; Redis, "
                             "when redis.url is set, bounds them per user, in bytes and by ttl_s)")
    max_entries_per_user: int = Field(default=1_000, ge=1, description="Keys one user holds at most: past it the "
                                      "user's oldest finished key goes; with only running ones, 429")


class AuthSettings(Section):
    mode: Literal["open", "keys"] = Field(
        default="open", description="open: one anonymous tenant; keys: Authorization: Bearer <API key> required"
    )
    key_cache_ttl_s: float = Field(default=30.0, ge=0, description="How long a verified key is trusted without lookup")
    key_sync_s: float = Field(default=1.0, gt=0, description="How often each replica reads the key store's changes "
                              "(revocations) and applies them to the keys it remembers: a revoked key stops working "
                              "everywhere within this time, and stays refused through a later outage of the store")
    outage_key_trust_s: float = Field(default=300.0, ge=0, description="While the key store cannot answer, how long "
                                      "after its last confirmation (a lookup, or a read of the changes) a remembered "
                                      "key keeps working; past it, 503 (0: at once)")
