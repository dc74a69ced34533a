"""The ``redis`` settings section: the one Redis (standalone, Sentinel or Cluster) that replicas share for caches,
credits, keys and idempotency. Composed into :class:`proxy.assembly.config.Settings`."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from proxy.core.settings_section import Section
from tiers.invalidation_bus import ACK_TIMEOUT_S, HEARTBEAT_S, LEASE_S
from tiers.near_cache import NEAR_TTL_S
from tiers.redis_connect import KEY_PREFIX, check_url, is_sentinel


class RedisSettings(Section):
    url: str | None = Field(
        default=None,
        description="redis://, redis+cluster:// or redis+sentinel://host:26379[,host:26379...]/service[/db] "
        "URL; set = shared mode (caches, credits, keys)",
    )
    cluster: bool = Field(default=False, description="The URL points at a Redis Cluster node")
    timeout_s: float = Field(default=0.25, gt=0, description="Bound on one cache operation against Redis")
    reconnect_s: float = Field(default=2.0, ge=0, description="How long a credit, API-key or idempotency operation "
                               "waits out a Redis that refuses connections (a restart) before the store counts as "
                               "unavailable")
    prefix: str = Field(default=KEY_PREFIX, min_length=1, description="Prefix of every shared-mode key and channel")
    wipe_check_s: float = Field(default=1.0, gt=0, description="How often each replica checks that Redis still holds "
                                "the sentinel written at start: gone, credits and keys run in outage mode and "
                                "/readyz answers 503 (docs/credits.md)")
    near_ttl_s: float = Field(default=NEAR_TTL_S, gt=0, description="Longest a replica keeps its near copy of an entry")
    bus_heartbeat_s: float = Field(default=HEARTBEAT_S, gt=0, description="Heartbeat period of the invalidation bus")
    bus_lease_s: float = Field(
        default=LEASE_S, gt=0, description="A replica that heard nothing on the bus this long stops serving near copies"
    )
    bus_ack_timeout_s: float = Field(default=ACK_TIMEOUT_S, gt=0, description="How long an invalidation waits for acks")
    prefix_ttl_s: float = Field(default=30.0, gt=0, description="Lifetime of shared KV prefix summaries")
    l1_max_bytes: int = Field(
        default=1024**3, ge=0,
        description="Bytes of answers (as stored, after compression) the shared L1 keeps in Redis, all replicas "
        "together; admitted and evicted by cost and size (0: no bound of its own, Redis's maxmemory evicts)",
    )
    l1_shards: int = Field(
        default=0, ge=0, le=4096,
        description="Shards (Cluster hash slots) the shared L1 and its budget are split over (0: 1 on standalone "
        "Redis, 16 on a Cluster); changing it starts the shared L1 empty",
    )
    l1_compress: bool = Field(
        default=True, description="lz4-compress answers in Redis with the built-in dictionary of response shapes"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if "{" in value or "}" in value:
            raise ValueError("must not contain braces (they are Redis Cluster hash tags)")
        return value

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: bool, info: ValidationInfo) -> bool:
        if value and is_sentinel(info.data.get("url") or ""):
            raise ValueError("a redis+sentinel:// URL names a Sentinel-managed master, not a Cluster")
        return value
