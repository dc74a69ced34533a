"""The ``cache`` settings section: the answer tiers (L1 exact, L2 semantic, L3 cold), stale-if-error and what every
tier shares; the search cache's own part, ``cache.retrieval``, is :class:`proxy.search.settings.RetrievalSettings`.
Composed into :class:`proxy.assembly.config.Settings`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from normalizer.bypass import BypassSettings
from normalizer.cache_control import DEFAULT_TTL_S
from proxy.core.settings_section import PolicyName, Section
from proxy.search.settings import RetrievalSettings
from tiers.calibration import DEFAULT_MAX_BYTES as DEFAULT_CALIBRATION_BYTES
from tiers.cold.store import DEFAULT_MAX_BYTES as DEFAULT_COLD_BYTES
from tiers.embedders import DEFAULT_RUNTIME, DEFAULT_UPSTREAM_DIM, DEFAULT_UPSTREAM_MODEL
from tiers.policies import DEFAULT_POLICY
from tiers.question_templates import DEFAULT_MAX_BYTES as DEFAULT_TEMPLATES_BYTES
from tiers.repeated_answers import DEFAULT_MAX_BYTES as DEFAULT_REPLIES_BYTES
from tiers.semantic import DEFAULT_ANSWER_AGREEMENT, DEFAULT_CANDIDATES, DEFAULT_MAX_WRONG_HIT_RATE
from tiers.vectors.hnsw import DEFAULT_MAX_BYTES as DEFAULT_INDEX_BYTES

_BYPASS = BypassSettings()  # the bypass rules' defaults, defined once there


class L1Settings(Section):
    enabled: bool = Field(default=True, description="In-process exact cache")
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=0, description="Bytes of cached responses in memory")
    max_entries: int = Field(default=200_000, ge=1, description="Entries in memory")
    ttl_s: float = Field(default=DEFAULT_TTL_S, gt=0, description="Default entry lifetime (every tier)")
    policy: PolicyName = Field(
        default=DEFAULT_POLICY, description="Eviction policy: lru, fifo, s3fifo, gdsf, landlord, bpcache"
    )


class L2Settings(Section):
    enabled: bool = Field(default=True, description="Semantic tier: equivalent questions reuse an answer")
    embedder: Literal["local", "upstream"] = Field(
        default="local", description="local: all-MiniLM-L6-v2 on the CPU; upstream: an OpenAI /v1/embeddings URL"
    )
    upstream_url: str | None = Field(default=None, description="Embeddings base URL (upstream embedder)")
    upstream_model: str = Field(default=DEFAULT_UPSTREAM_MODEL, description="Model of the upstream embedder")
    upstream_dim: int = Field(default=DEFAULT_UPSTREAM_DIM, ge=1, description="Vector size of the upstream embedder")
    upstream_api_key: SecretStr | None = Field(default=None, description="Key for the upstream embedder")
    embedder_runtime: Literal["auto", "onnx", "numpy"] = Field(
        default=DEFAULT_RUNTIME, description="local embedder: onnx (int8 graph on onnxruntime, a few ms), numpy (no "
        "onnxruntime needed, 10-30 ms); auto: onnx when onnxruntime and onnx are installed")
    max_wrong_hit_rate: float = Field(
        default=DEFAULT_MAX_WRONG_HIT_RATE, gt=0, lt=1,
        description="Error bound: per tenant and namespace, the lowest threshold where the "
        "wrong share of served semantic hits is within it with 95% confidence (see docs/semantic.md); reported in "
        "/admin/stats and /metrics")
    verify_fraction: float = Field(
        default=0.02, ge=0, le=1, description="Share of would-be semantic hits forwarded and compared with the cached "
        "answer to keep the estimate honest (misses with a near candidate are compared for free; 10% while a "
        "namespace has fewer than 20 comparisons at or above its threshold)")
    answer_agreement: float = Field(
        default=DEFAULT_ANSWER_AGREEMENT, gt=0, le=1,
        description="Similarity of two answers (TF-IDF cosine of their content words, the "
        "questions' own words left out) from which they agree; identical text always does")
    threshold: float | None = Field(
        default=None, gt=0, le=1, description="Fixed cosine threshold for every namespace: overrides the error bound "
        "(no calibration)")
    namespace_thresholds: dict[str, float] = Field(
        default_factory=dict, description="Fixed per-namespace thresholds, e.g. written by ragproxy calibrate --write")
    guards: list[str] = Field(
        default_factory=lambda: ["numbers", "dates", "negations", "entities", "order"],
        description="Vetoes of look-alike questions (normalizer.guards); the defaults pay on real question pairs",
    )
    candidates: int = Field(default=DEFAULT_CANDIDATES, ge=1, description="Nearest questions examined per lookup")
    vector_store: Literal["hnsw", "qdrant"] = Field(
        default="hnsw", description="hnsw: per-process index under data_dir; qdrant: shared collection"
    )
    qdrant_url: str | None = Field(default=None, description="Qdrant for the shared semantic index")
    expose_similarity: bool = Field(default=False, description="Send X-Cache-Similarity (tells how close a hit was)")
    persist_interval_s: float = Field(default=60.0, gt=0, description="How often the hnsw index is saved")
    max_bytes: int = Field(
        default=DEFAULT_INDEX_BYTES, ge=64 * 1024, description="Memory of the embedded (hnsw) index: vectors and "
        "questions of every namespace and context; beyond it whole partitions are evicted, the least recently used of "
        "the tenant holding the most first, and a restart reloads no more (docs/semantic.md)")
    calibration_max_bytes: int = Field(
        default=DEFAULT_CALIBRATION_BYTES, ge=64 * 1024, description="Memory of the calibration evidence kept per "
        "tenant and namespace (about 2 KB each); beyond it the least recently used namespace of the tenant holding "
        "the most is forgotten (calibrating again)")
    templates_max_bytes: int = Field(
        default=DEFAULT_TEMPLATES_BYTES, ge=64 * 1024, description="Memory of the question templates learnt per "
        "tenant and namespace; beyond it the least recently used namespace of the tenant holding the most is "
        "forgotten")
    replies_max_bytes: int = Field(
        default=DEFAULT_REPLIES_BYTES, ge=64 * 1024, description="Memory of the answers kept per tenant and namespace "
        "to tell fixed replies (one answer to several questions: not calibration evidence); beyond it the least "
        "recently used namespace of the tenant holding the most is forgotten")

    @model_validator(mode="after")
    def _complete(self) -> L2Settings:
        if self.enabled and self.embedder == "upstream" and self.upstream_url is None:
            raise ValueError("embedder is upstream but upstream_url is not set")
        if self.enabled and self.vector_store == "qdrant" and self.qdrant_url is None:
            raise ValueError("vector_store is qdrant but qdrant_url is not set")
        return self


class L3Settings(Section):
    enabled: bool = Field(default=True, description="Persistent lz4-compressed cold tier under data_dir/cold")
    max_bytes: int = Field(default=DEFAULT_COLD_BYTES, ge=1024 * 1024, description="Disk bytes the cold tier may use")
    policy: PolicyName = Field(default=DEFAULT_POLICY, description="Eviction policy of the cold tier")
    write_queue: int = Field(default=1024, ge=1, description="Pending cold writes; beyond it writes are dropped")
    warmup_entries: int = Field(default=0, ge=0, description="Hottest cold entries copied into L1 at start")


class StaleSettings(Section):
    namespaces: list[str] = Field(
        default_factory=list, description="Stale-tolerant namespaces: on upstream failure, serve the last good answer"
    )
    max_entries: int = Field(default=10_000, ge=1, description="Last good answers kept for stale-if-error")
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="Memory for those answers")
    max_stale_s: float = Field(default=86_400.0, gt=0, description="Oldest answer served stale")


class CacheSettings(Section):
    enabled: bool = Field(default=True, description="Master switch of every response tier")
    l1: L1Settings = Field(default_factory=L1Settings)
    l2: L2Settings = Field(default_factory=L2Settings)
    l3: L3Settings = Field(default_factory=L3Settings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    stale: StaleSettings = Field(default_factory=StaleSettings)
    cache_sampled: bool = Field(
        default=True, description="Cache answers to requests with temperature > 0 (see normalizer docs)"
    )
    unknown_fields: Literal["bypass", "ignore"] = Field(
        default=_BYPASS.unknown_fields, description="Requests with fields the key cannot judge are not cached"
    )
    rerank_max_documents: int = Field(
        default=_BYPASS.rerank_max_documents, ge=0,
        description="Documents of one rerank or score request cached one by one; a request with "
        "more goes upstream and back uncached (BYPASS): parsing and re-encoding its answer would hold the event loop "
        "(normalizer.bypass)"
    )
    cache_stored_responses: bool = Field(
        default=True, description="Answer an exact repeat of a /v1/responses request stored upstream (store: true, the "
        "API's default) with the stored original: same id, so retrieving and continuing it work upstream; never a "
        "semantic hit, never shared across tenants (normalizer.responses)"
    )
    shared_namespaces: list[str] = Field(default_factory=list, description="Namespaces shared by all tenants")
    private_namespaces: list[str] = Field(
        default_factory=list, description="Namespaces whose answers are cached per user: never served to another user"
    )
    coalesce_wait_s: float = Field(default=30.0, gt=0, description="Longest a duplicate miss waits for the leader")
    expose_key: bool = Field(default=False, description="Send X-Cache-Key on responses (a probing oracle)")
    key_headers: list[str] = Field(
        default_factory=lambda: ["OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta"],
        description="Request headers that may change the upstream's answer: part of every cache key and context "
        "signature when forwarded (upstreams.forward_headers; OpenAI-Beta is by default) and not named in Connection "
        "(the query string always is)",
    )
    trace_file: Path | None = Field(
        default=None, description="Append key/size/cost/time of every cached or stored answer (for ragproxy simulate)"
    )

    @field_validator("private_namespaces")
    @classmethod
    def _private(cls, value: list[str], info: Any) -> list[str]:
        from normalizer.cache_control import NAMESPACE_PATTERN

        for name in value:
            if not NAMESPACE_PATTERN.fullmatch(name):
                raise ValueError(f"{name!r} is not a namespace (1-64 of A-Z a-z 0-9 _ . -, starting alphanumeric)")
        both = sorted(set(value) & set(info.data.get("shared_namespaces") or ()))
        if both:
            raise ValueError(f"{both} cannot be both shared by all tenants and private to each user")
        return value
