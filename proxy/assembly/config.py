"""The one typed configuration object, and how it is built.

Sources, lowest precedence first: built-in defaults (embedded mode: no Redis, no Qdrant needed), a YAML file
(``--config``), ``RAGPROXY_*`` environment variables, command-line flags. A nested key ``a.b.c`` is written
``RAGPROXY_A__B__C`` in the environment and ``--set a.b.c=VALUE`` on the command line; values from the environment
and ``--set`` are parsed as YAML scalars/flow collections, so ``8080``, ``true``, ``[a, b]`` and JSON all work.

An invalid value raises :class:`ConfigError` naming the key, the value and what is allowed; the CLI turns it into a
one-line message and exit code 2.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from normalizer.paths import check_pattern
from proxy.core.settings_section import Section
from proxy.credits.settings import CreditsSettings, IdempotencySettings
from proxy.kv.kinds import KINDS
from proxy.kv.settings import RoutingSettings
from tiers.policies import POLICY_NAMES
from tiers.redis_connect import check_url, is_sentinel

ENV_PREFIX = "RAGPROXY_"


class ConfigError(ValueError):
    """A configuration value that cannot be used."""


def _known_policy(name: str) -> str:
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown eviction policy; allowed: {', '.join(POLICY_NAMES)}")
    return name


PolicyName = Annotated[str, AfterValidator(_known_policy)]


def _http_url(value: str) -> str:
    if not re.match(r"^https?://[^\s/]+", value):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


class LLMBackend(Section):
    """One OpenAI-compatible inference replica."""

    url: str = Field(description="Base URL without /v1, e.g. http://vllm:8000")
    name: str | None = Field(default=None, description="Label in metrics and admin; defaults to the URL")
    kind: str = Field(
        default="openai", description=f"Which prefix-cache hints the backend understands: {', '.join(KINDS)} "
        "(generic: none)"
    )
    api_key: SecretStr | None = Field(default=None, description="Key the proxy sends upstream (never the client's)")
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding api_key (a hosted API's key stays off "
        "the command line and out of config files)")
    max_concurrency: int = Field(default=64, ge=1, description="Requests in flight to this replica at once")
    slots: int = Field(default=1, ge=1, description="llama.cpp server slots (parallel sequences with their own KV)")
    kv_capacity_tokens: int = Field(default=200_000, ge=1, description="Prompt tokens the replica's KV cache holds")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        url = _http_url(value)
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in KINDS:
            raise ValueError(f"allowed: {', '.join(KINDS)}")
        return value

    @model_validator(mode="after")
    def _key_from_environment(self) -> LLMBackend:
        if self.api_key_env is None:
            return self
        value = os.environ.get(self.api_key_env)
        if self.api_key is not None:  # resolved already (settings validated again after a runtime patch)
            if self.api_key.get_secret_value() == value:
                return self
            raise ValueError("give api_key or api_key_env, not both")
        if not value:
            raise ValueError(f"api_key_env: the environment variable {self.api_key_env} is not set")
        object.__setattr__(self, "api_key", SecretStr(value))  # validate_assignment would run this validator again
        return self

    @property
    def label(self) -> str:
        """The name, or the URL without any user:password (labels reach logs, metrics and error bodies)."""
        return self.name or redact_url(self.url, mask="")


class QdrantUpstream(Section):
    """The Qdrant server behind the proxy (REST)."""

    url: str | None = Field(default=None, description="e.g. http://qdrant:6333; unset = Qdrant routes answer 502")
    api_key: SecretStr | None = Field(default=None, description="Sent upstream as the api-key header")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _http_url(value)


class Upstreams(Section):
    llm: list[LLMBackend] = Field(
        default_factory=lambda: [LLMBackend(url="http://127.0.0.1:8000")],
        min_length=1,
        description="LLM replicas; the first healthy one is used until routing is configured",
    )
    qdrant: QdrantUpstream = Field(default_factory=QdrantUpstream)
    llm_passthrough: list[str] = Field(
        default_factory=lambda: ["GET /v1/models", "GET /v1/models/*"],
        description="Other LLM API requests forwarded as they are, as 'METHOD /v1/path' patterns ('*': one path "
        "segment); each is authenticated and billed credits.request_price; every other /v1 request the proxy has "
        "no route for is refused (404)",
    )
    response_retention_s: float = Field(
        default=30 * 86_400.0, gt=0, description="How long the LLM upstream keeps a stored response (OpenAI: 30 days): "
        "the proxy remembers that long which tenant and replica made it, and caches it no longer"
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP connect timeout to any upstream")
    read_timeout_s: float = Field(default=300.0, gt=0, description="Longest silence from an upstream")
    health_interval_s: float = Field(default=5.0, gt=0, description="Background health-check period")
    health_interval_down_s: float = Field(
        default=0.5, gt=0, description="Health-check period of a replica that is down (its first success half-opens "
                                       "its breaker: recovery is as quick as the replica)"
    )
    pool_size: int = Field(default=256, ge=1, description="Keep-alive connections per upstream host")
    breaker_failures: int = Field(default=5, ge=1, description="Consecutive failures that open a replica's breaker")
    breaker_open_s: float = Field(default=5.0, gt=0, description="Seconds an open breaker waits before a probe")

    @field_validator("llm_passthrough")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return [check_pattern(pattern) for pattern in value]


class Server(Section):
    host: str = Field(default="127.0.0.1", description="Data-plane bind address")
    port: int = Field(default=8080, ge=1, le=65535, description="Data-plane port")
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description="Largest request body accepted")
    read_timeout_s: float = Field(
        default=60.0, gt=0, description="Longest silence from a client in the middle of sending a request (then 408)"
    )
    head_timeout_s: float = Field(
        default=10.0, gt=0, description="Longest time to receive a whole request head, however steadily it trickles "
                                        "in (then 408); a new connection's first head counts from the connect"
    )
    body_timeout_s: float = Field(
        default=60.0, gt=0, description="Longest time to receive a whole request body after its head, however "
                                        "steadily it trickles in (then 408): max_body_bytes needs 280 KB/s"
    )
    max_connections: int = Field(
        default=10_000, ge=1, description="Client connections per process, at most 3/4 of the open-file limit; past "
                                          "it the connection idle the longest is closed"
    )
    shutdown_grace_s: float = Field(default=30.0, ge=0, description="Drain time for in-flight requests on SIGTERM")
    trust_forwarded: bool = Field(default=False, description="Keep incoming X-Forwarded-* chains")


class L1Settings(Section):
    enabled: bool = Field(default=True, description="In-process exact cache")
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=0, description="Bytes of cached responses in memory")
    max_entries: int = Field(default=200_000, ge=1, description="Entries in memory")
    ttl_s: float = Field(default=3600.0, gt=0, description="Default entry lifetime (every tier)")
    policy: PolicyName = Field(
        default="bpcache", description="Eviction policy: lru, fifo, s3fifo, gdsf, landlord, bpcache"
    )


class L2Settings(Section):
    enabled: bool = Field(default=True, description="Semantic tier: equivalent questions reuse an answer")
    embedder: Literal["local", "upstream"] = Field(
        default="local", description="local: all-MiniLM-L6-v2 on the CPU; upstream: an OpenAI /v1/embeddings URL"
    )
    upstream_url: str | None = Field(default=None, description="Embeddings base URL (upstream embedder)")
    upstream_model: str = Field(default="text-embedding-3-small", description="Model of the upstream embedder")
    upstream_dim: int = Field(default=1536, ge=1, description="Vector size of the upstream embedder")
    upstream_api_key: SecretStr | None = Field(default=None, description="Key for the upstream embedder")
    embedder_runtime: Literal["auto", "onnx", "numpy"] = Field(
        default="auto", description="local embedder: onnx (int8 graph on onnxruntime, a few ms), numpy (no onnxruntime "
        "needed, 10-30 ms); auto: onnx when onnxruntime and onnx are installed")
    max_wrong_hit_rate: float = Field(
        default=0.05, gt=0, lt=1, description="Error bound: per tenant and namespace, the lowest threshold where the "
        "wrong share of served semantic hits is within it with 95% confidence (see docs/semantic.md); reported in "
        "/admin/stats and /metrics")
    verify_fraction: float = Field(
        default=0.02, ge=0, le=1, description="Share of would-be semantic hits forwarded and compared with the cached "
        "answer to keep the estimate honest (misses with a near candidate are compared for free; 10% while a "
        "namespace has fewer than 20 comparisons at or above its threshold)")
    answer_agreement: float = Field(
        default=0.4, gt=0, le=1, description="Similarity of two answers (TF-IDF cosine of their content words, the "
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
    candidates: int = Field(default=4, ge=1, description="Nearest questions examined per lookup")
    vector_store: Literal["hnsw", "qdrant"] = Field(
        default="hnsw", description="hnsw: per-process index under data_dir; qdrant: shared collection"
    )
    qdrant_url: str | None = Field(default=None, description="Qdrant for the shared semantic index")
    expose_similarity: bool = Field(default=False, description="Send X-Cache-Similarity (tells how close a hit was)")
    persist_interval_s: float = Field(default=60.0, gt=0, description="How often the hnsw index is saved")

    @model_validator(mode="after")
    def _complete(self) -> L2Settings:
        if self.enabled and self.embedder == "upstream" and self.upstream_url is None:
            raise ValueError("embedder is upstream but upstream_url is not set")
        if self.enabled and self.vector_store == "qdrant" and self.qdrant_url is None:
            raise ValueError("vector_store is qdrant but qdrant_url is not set")
        return self


class L3Settings(Section):
    enabled: bool = Field(default=True, description="Persistent lz4-compressed cold tier under data_dir/cold")
    max_bytes: int = Field(default=8 * 1024**3, ge=1024 * 1024, description="Disk bytes the cold tier may use")
    policy: PolicyName = Field(default="bpcache", description="Eviction policy of the cold tier")
    write_queue: int = Field(default=1024, ge=1, description="Pending cold writes; beyond it writes are dropped")
    warmup_entries: int = Field(default=0, ge=0, description="Hottest cold entries copied into L1 at start")


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
        default="bypass", description="Requests with fields the key cannot judge are not cached"
    )
    rerank_max_documents: int = Field(
        default=1000, ge=0, description="Documents of one rerank or score request cached one by one; a request with "
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
        description="Request headers forwarded upstream that may change its answer: part of every cache key and "
        "context signature (the query string always is)",
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


class LimitsSettings(Section):
    json_depth: int = Field(
        default=128, ge=2, le=255, description="Deepest nesting of a JSON request body, 400 beyond (Qdrant's JSON "
        "parser refuses more than 128 levels; the proxy re-encodes at most 255)"
    )
    embedding_inputs: int = Field(default=2048, ge=1, description="Items in one embeddings input, 413 beyond "
                                  "(OpenAI's limit)")
    search_batch: int = Field(default=1000, ge=1, description="Searches in one Qdrant batch request, 413 beyond")
    prefetch_depth: int = Field(default=64, ge=1, description="Nesting of prefetch in a Qdrant query, 400 beyond "
                                "(Qdrant's own limit)")
    rerank_documents: int = Field(default=10_000, ge=1, description="Documents in one rerank or score request, "
                                  "413 beyond (Cohere's limit)")


class AuthSettings(Section):
    mode: Literal["open", "keys"] = Field(
        default="open", description="open: one anonymous tenant; keys: Authorization: Bearer <API key> required"
    )
    key_cache_ttl_s: float = Field(default=30.0, ge=0, description="How long a verified key is trusted without lookup")


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
    prefix: str = Field(default="ragproxy", min_length=1, description="Prefix of every shared-mode key and channel")
    wipe_check_s: float = Field(default=1.0, gt=0, description="How often each replica checks that Redis still holds "
                                "the sentinel written at start: gone, credits and keys run in outage mode and "
                                "/readyz answers 503 (docs/credits.md)")
    near_ttl_s: float = Field(default=30.0, gt=0, description="Longest a replica keeps its near copy of an entry")
    bus_heartbeat_s: float = Field(default=0.5, gt=0, description="Heartbeat period of the invalidation bus")
    bus_lease_s: float = Field(
        default=3.0, gt=0, description="A replica that heard nothing on the bus this long stops serving near copies"
    )
    bus_ack_timeout_s: float = Field(default=1.0, gt=0, description="How long an invalidation waits for acks")
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


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class AdminSettings(Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8081, ge=1, le=65535)
    token: SecretStr | None = Field(default=None, description="Bearer token; required unless bound to loopback")

    def bind_problem(self) -> str | None:
        """Why the admin API must not start with these settings (``serve`` and ``check-config`` refuse them), or
        ``None``."""
        if self.enabled and self.token is None and not is_loopback(self.host):
            return (f"admin API on {self.host}:{self.port} without admin.token: set admin.token "
                    "(RAGPROXY_ADMIN__TOKEN) or bind admin.host to 127.0.0.1")
        return None


class TelemetrySettings(Section):
    tracing: bool = Field(default=False, description="OpenTelemetry spans per request and pipeline stage")
    otlp_endpoint: str | None = Field(default=None, description="OTLP/HTTP traces endpoint, e.g. http://otel:4318/v1/traces")
    service_name: str = Field(default="ragproxy", description="service.name resource attribute")


class LoggingSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Minimum level logged")
    format: Literal["auto", "json", "text"] = Field(
        default="auto", description="Log line format; auto: plain text when stderr is a terminal, else JSON")
    access_log: bool = Field(default=False, description="One structured line per data-plane request")


class Settings(Section):
    """Everything ragproxy can be told."""

    server: Server = Field(default_factory=Server)
    upstreams: Upstreams = Field(default_factory=Upstreams)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    credits: CreditsSettings = Field(default_factory=CreditsSettings)
    idempotency: IdempotencySettings = Field(default_factory=IdempotencySettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    data_dir: Path = Field(default=Path("./ragproxy-data"), description="Where embedded stores keep their files")

    @model_validator(mode="after")
    def _complete(self) -> Settings:
        if self.credits.store == "redis" and self.redis.url is None:
            raise ValueError("credits.store is redis but redis.url is not set")
        if self.admin.enabled and self.admin.port == self.server.port and _same_address(self.admin.host,
                                                                                         self.server.host):
            raise ValueError(f"admin.port {self.admin.port} is server.port too; the admin API needs a port of its own")
        return self


def _same_address(one: str, other: str) -> bool:
    """Whether two bind addresses can collide on one port (the same, or either listens on every address)."""
    return one == other or {one, other} & {"0.0.0.0", "::", ""} != set()


def load_settings(
    config_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge file < environment < overrides and validate."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        _deep_merge(merged, _read_yaml(Path(config_file)))
    env = os.environ if env is None else env
    for name, raw in env.items():
        if name.startswith(ENV_PREFIX) and name != ENV_PREFIX + "CONFIG":
            path = name[len(ENV_PREFIX):].lower().split("__")
            _set_path(merged, path, _parse_scalar(raw, ".".join(path)))
    for dotted, value in (overrides or {}).items():
        _set_path(merged, dotted.split("."), value)
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, merged)) from None


def parse_assignment(text: str) -> tuple[str, Any]:
    """``a.b=VALUE`` → (``a.b``, parsed VALUE)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. server.port=9000")
    return key.strip(), _parse_scalar(raw, key.strip())


_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)


def redact_url(text: str, mask: str = "***@") -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``mask`` (for logs, labels, errors and
    printed configuration): the one credential scrubber."""
    return _URL_CREDENTIALS.sub(lambda match: match["scheme"] + mask, text)


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective configuration as plain data, secrets masked (also passwords inside URLs)."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return redact_url(value)
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, list):
            return [clean(item) for item in value]
        return value

    return dict(clean(settings.model_dump(mode="json", by_alias=True)))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r}: not valid YAML ({exc.__class__.__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r}: the top level must be a mapping of sections")
    return data


def _parse_scalar(raw: str, key: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        raise ConfigError(f"{key} = {raw!r}: not a valid value") from None


def _deep_merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        elif isinstance(value, Mapping):
            into[key] = {}
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _set_path(into: dict[str, Any], path: list[str], value: Any) -> None:
    node = into
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def _describe(exc: ValidationError, merged: Mapping[str, Any]) -> str:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown setting (check the spelling; see `ragproxy check-config` for all keys)"
    allowed = error["msg"].removeprefix("Value error, ")
    if error["type"] == "value_error" and isinstance(error.get("input"), Mapping):  # a rule across a section
        return f"{key}: {allowed}" if key else allowed
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        allowed = f"allowed: {ctx['expected']}"
    return f"{key} = {_redact(key, error.get('input'))!r}: {redact_url(str(allowed))}"


_SECRET_KEYS = ("key", "secret", "token", "password")


def _redact(key: str, value: Any) -> Any:
    """A rejected value as the error may show it: secrets masked, credentials inside URLs masked."""
    if not isinstance(value, str):
        return value
    if any(word in key.rsplit(".", 1)[-1].lower() for word in _SECRET_KEYS):
        return "***"
    return redact_url(value)
