"""The ``routing`` settings section: the KV layer's knowledge tree, document order, prefix hints and routing by
estimated time to first token. Composed into :class:`proxy.assembly.config.Settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from normalizer.documents import DEFAULT_MAX_BYTES as DEFAULT_DOCUMENTS_BYTES
from normalizer.repeated_blocks import DEFAULT_MAX_BYTES as DEFAULT_REPEATED_BYTES
from proxy.core.settings_section import Section


class RoutingSettings(Section):
    enabled: bool = Field(default=True, description="Knowledge tree, document order, prefix hints, TTFT routing")
    ttft_slo_s: float | None = Field(default=None, gt=0, description="Answer 429 when no replica can start sooner")
    order: Literal["preserve", "reuse", "shift"] = Field(
        default="reuse",
        description="preserve: retrieval order; reuse: follow the longest cached path; shift: reuse, and llama.cpp "
                    "may also reuse cached documents outside the prefix (approximate)",
    )
    namespace_orders: dict[str, Literal["preserve", "reuse", "shift"]] = Field(
        default_factory=dict, description="Order policy per namespace"
    )
    shift_min_tokens: int = Field(
        default=64, ge=1, description="shift: shortest cached run llama.cpp moves instead of recomputing"
    )
    queue_max_wait_s: float = Field(default=30.0, gt=0, description="Longest wait for a replica's concurrency slot")
    starvation_window_s: float = Field(default=2.0, ge=0, description="Cache-aware queue order yields after this")
    affinity_headroom: float = Field(
        default=0.7, gt=0, le=1, description="With an SLO: least prefill among replicas within this share of it"
    )
    llama_prompt_cache: bool = Field(
        default=True, description="llama.cpp keeps prompts in host memory (--cache-ram): id_slot on shared prefixes"
    )
    documents: int = Field(
        default=10_000, ge=1, description="Documents remembered from search results and moving paragraphs"
    )
    documents_max_bytes: int = Field(
        default=DEFAULT_DOCUMENTS_BYTES, ge=1024,
        description="Memory for those documents (estimated; oldest leave first)",
    )
    repeated_blocks_max_bytes: int = Field(
        default=DEFAULT_REPEATED_BYTES, ge=0,
        description="Memory for recognising blank-line-joined documents that move between requests (hashes of "
                    "paragraphs seen; least recently seen leave first; 0: off)",
    )
    salt_secret: SecretStr | None = Field(default=None, description="Secret mixed into per-tenant cache_salt hints")
    expose_headers: bool = Field(
        default=False,
        description="Send X-RagProxy-Replica and X-RagProxy-Cached-Tokens-Estimate (they reveal others' prompts)",
    )
