"""Sentence embedders for the semantic tier: the contract, its backends, batching and caching.

- :class:`~tiers.embedders.base.Embedder`: ``await embed(texts)`` → L2-normalized float32 rows;
  ``dim``; ``name``.
- ``local``: :class:`~tiers.embedders.local.LocalEmbedder` (all-MiniLM-L6-v2, no torch: an int8 graph on
  onnxruntime, :mod:`~tiers.embedders.onnx_minilm`, or the numpy forward pass, :mod:`~tiers.embedders.minilm`).
- ``upstream``: :class:`~tiers.embedders.upstream.UpstreamEmbedder` (OpenAI-compatible ``/v1/embeddings``).
- the client's own vector: :func:`~tiers.embedders.client.client_vector` (Qdrant searches carry one).
- :class:`~tiers.embedders.cached.CachedEmbedder` (LRU by normalized text) wraps either backend;
  :func:`build_embedder` assembles the configured stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from tiers.embedders.base import Embedder, FloatArray, normalize_rows
from tiers.embedders.cached import CachedEmbedder
from tiers.embedders.client import client_vector
from tiers.embedders.local import LocalEmbedder
from tiers.embedders.upstream import UpstreamEmbedder, UpstreamEmbeddingError
from tiers.fetch import Fetcher

DEFAULT_UPSTREAM_MODEL = "text-embedding-3-small"
DEFAULT_UPSTREAM_DIM = 1536
"""The upstream embedder's model and vector size unless configured (``cache.l2.upstream_model``, ``upstream_dim``)."""
DEFAULT_RUNTIME: Literal["auto", "onnx", "numpy"] = "auto"
"""The local model's runtime by default (``cache.l2.embedder_runtime``): onnx when installed, else numpy."""

__all__ = [
    "DEFAULT_RUNTIME",
    "CachedEmbedder",
    "Embedder",
    "FloatArray",
    "LocalEmbedder",
    "UpstreamEmbedder",
    "UpstreamEmbeddingError",
    "build_embedder",
    "client_vector",
    "local_embedder",
    "normalize_rows",
]

def build_embedder(
    kind: Literal["local", "upstream"] = "local",
    *,
    cache_capacity: int = 10_000,
    upstream_url: str | None = None,
    upstream_model: str = DEFAULT_UPSTREAM_MODEL,
    upstream_dim: int = DEFAULT_UPSTREAM_DIM,
    upstream_api_key: str | None = None,
    upstream_client: Fetcher | None = None,
    max_batch: int = 32,
    max_wait_s: float = 0.0,
    runtime: Literal["auto", "onnx", "numpy"] = DEFAULT_RUNTIME,
    model_cache_dir: Path | None = None,
) -> CachedEmbedder:
    """The configured backend behind an LRU cache of ``cache_capacity`` texts (0 disables caching). ``runtime``: of
    the local model (``auto``: onnx when installed); ``model_cache_dir``: where the int8 graph is kept."""
    if kind == "local":
        local = local_embedder(runtime, model_cache_dir, max_batch=max_batch, max_wait_s=max_wait_s)
        return CachedEmbedder(local, capacity=cache_capacity, case_insensitive=local.case_insensitive)
    if kind == "upstream":
        if not upstream_url or upstream_client is None:
            raise ValueError("the upstream embedder needs upstream_url and upstream_client")
        upstream = UpstreamEmbedder(
            upstream_url,
            upstream_model,
            upstream_dim,
            client=upstream_client,
            api_key=upstream_api_key,
            max_batch=max_batch,
            max_wait_s=max_wait_s,
        )
        return CachedEmbedder(upstream, capacity=cache_capacity)
    raise ValueError(f"unknown embedder kind {kind!r}; allowed: 'local', 'upstream'")



def local_embedder(runtime: Literal["auto", "onnx", "numpy"] = DEFAULT_RUNTIME, model_cache_dir: Path | None = None, *,
                   max_batch: int = 32, max_wait_s: float = 0.0) -> LocalEmbedder:
    """all-MiniLM-L6-v2 on onnxruntime (int8, cached in ``model_cache_dir``) or numpy; ``auto``: onnx when
    installed."""
    from tiers.embedders.onnx_minilm import OnnxMiniLMEncoder, onnx_available

    if runtime == "onnx" or (runtime == "auto" and onnx_available()):
        cache = model_cache_dir or Path.home() / ".cache" / "ragproxy"
        return LocalEmbedder(load=lambda: OnnxMiniLMEncoder(cache), runtime="onnx-int8", max_batch=max_batch,
                             max_wait_s=max_wait_s)
    return LocalEmbedder(max_batch=max_batch, max_wait_s=max_wait_s)
