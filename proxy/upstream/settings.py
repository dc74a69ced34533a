"""The ``upstreams`` settings section: the LLM replicas and the Qdrant server behind the proxy, and how the proxy
talks to them. Composed into :class:`proxy.assembly.config.Settings`."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from normalizer.paths import check_pattern
from proxy.core.headers import forwardable
from proxy.core.settings_section import Section

BACKEND_KINDS = ("openai", "vllm", "sglang", "llamacpp", "generic")
"""The backend kinds ``upstreams.llm[].kind`` may name: each is an adapter in :data:`proxy.kv.kinds.KINDS`."""


def _http_url(value: str) -> str:
    if not re.match(r"^https?://[^\s/]+", value):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)


def redact_url(text: str, mask: str = "***@") -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``mask`` (for logs, labels, errors and
    printed configuration): the one credential scrubber."""
    return _URL_CREDENTIALS.sub(lambda match: match["scheme"] + mask, text)


class LLMBackend(Section):
    """One OpenAI-compatible inference replica."""

    url: str = Field(description="Base URL without /v1, e.g. http://vllm:8000")
    name: str | None = Field(default=None, description="Label in metrics and admin; defaults to the URL")
    kind: str = Field(
        default="openai", description=f"Which prefix-cache hints the backend understands: {', '.join(BACKEND_KINDS)} "
        "(generic: none)"
    )
    api_key: SecretStr | None = Field(default=None, description="Key the proxy sends upstream (never the client's)")
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding api_key (a hosted API's key stays off "
        "the command line and out of config files)")
    max_concurrency: int = Field(default=64, ge=1, description="Requests in flight to this replica at once")
    slots: int = Field(default=1, ge=1, description="llama.cpp server slots (parallel sequences with their own KV)")
    kv_capacity_tokens: int = Field(
        default=200_000, ge=1, description="The replica's KV cache size in prompt tokens, as the proxy first "
        "estimates it: a llama.cpp replica's /slots raises it to slots x n_ctx when that is more (so for llama.cpp it "
        "is a floor: its host prompt cache holds more, and the proxy's account of that host cache holds this many), "
        "and the cache hits every replica reports correct it from there, within 1/8 and 4 times the value")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        url = _http_url(value)
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in BACKEND_KINDS:
            raise ValueError(f"allowed: {', '.join(BACKEND_KINDS)}")
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


PROXY_COLLECTIONS = "ragproxy_"
"""The start of every upstream collection name that is the proxy's own: the tenants' namespaces
(:mod:`proxy.search.tenancy`) and the shared semantic index (``ragproxy_semantic``)."""


class CollectionGrant(Section):
    """The tenants that reach one upstream collection (or alias) outside their namespaces, under its upstream name;
    ``"*"`` names every tenant. Writing includes reading; the collection itself (its settings, indexes, aliases,
    deletion) stays the operator's."""

    read: list[str] = Field(default_factory=list, description="Tenants that search and read its points")
    write: list[str] = Field(default_factory=list, description="Tenants that also change its points and payloads")


class QdrantUpstream(Section):
    """The Qdrant server behind the proxy (REST), and which of its collections each tenant reaches."""

    url: str | None = Field(default=None, description="e.g. http://qdrant:6333; unset = Qdrant routes answer 502")
    api_key: SecretStr | None = Field(default=None, description="Sent upstream as the api-key header")
    collections: dict[str, CollectionGrant] = Field(
        default_factory=dict, description="Upstream collections (made outside the proxy) that tenants reach besides "
        "their own, by upstream name: {name: {read: [tenants], write: [tenants]}}; every other collection a tenant "
        "names is its own, kept under a name of the tenant's namespace")
    anonymous: Literal["upstream", "namespace"] = Field(
        default="upstream", description="What a request without an API key reaches in auth.mode=open (the one "
        f"anonymous tenant): upstream = Qdrant's collections under their own names, save the proxy's own "
        f"({PROXY_COLLECTIONS}*); namespace = a namespace of its own, like any tenant")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _http_url(value)

    @field_validator("collections")
    @classmethod
    def _collections(cls, value: dict[str, CollectionGrant]) -> dict[str, CollectionGrant]:
        own = sorted(name for name in value if name.startswith(PROXY_COLLECTIONS))
        if own:
            raise ValueError(f"{', '.join(own)}: names starting with {PROXY_COLLECTIONS} are the proxy's own")
        return value


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
    forward_headers: list[str] = Field(
        default_factory=list, description="Client headers forwarded upstream besides Accept, User-Agent, OpenAI-Beta "
        "and a valid traceparent/tracestate (e.g. OpenAI-Project); credentials, hop-by-hop, forwarding and override "
        "headers (X-Original-URL, X-HTTP-Method-Override, X-Forwarded-*, ...) are refused"
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

    @field_validator("forward_headers")
    @classmethod
    def _forward_headers(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name) or not forwardable(name):
                raise ValueError(f"{name!r}: not a header the proxy forwards from clients (credentials, hop-by-hop, "
                                 "forwarding and override headers never are)")
        return value

    @field_validator("llm_passthrough")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return [check_pattern(pattern) for pattern in value]
