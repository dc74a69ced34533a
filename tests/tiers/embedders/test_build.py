"""Assembling the configured embedder stack."""

from __future__ import annotations

import pytest

from proxy.upstream.client import UpstreamClient
from tiers.embedders import CachedEmbedder, LocalEmbedder, UpstreamEmbedder, build_embedder, client_vector


async def test_local_is_cached_case_insensitively() -> None:
    embedder = build_embedder("local", cache_capacity=5)
    assert isinstance(embedder, CachedEmbedder) and isinstance(embedder.inner, LocalEmbedder)
    assert embedder.case_insensitive and embedder.capacity == 5 and embedder.dim == 384
    await embedder.close()


async def test_upstream_needs_a_url_and_a_client_and_keeps_case() -> None:
    client = UpstreamClient(connect_timeout=1, read_timeout=1, pool_size=1)
    with pytest.raises(ValueError, match="upstream_url"):
        build_embedder("upstream", upstream_client=client)
    with pytest.raises(ValueError, match="upstream_client"):
        build_embedder("upstream", upstream_url="http://127.0.0.1:9/v1/embeddings")
    embedder = build_embedder("upstream", upstream_url="http://127.0.0.1:9/v1/embeddings", upstream_dim=8,
                              upstream_client=client)
    assert isinstance(embedder.inner, UpstreamEmbedder) and not embedder.case_insensitive and embedder.dim == 8
    await embedder.close()
    await client.close()


def test_unknown_kinds_are_rejected() -> None:
    with pytest.raises(ValueError, match="allowed"):
        build_embedder("telepathy")  # type: ignore[arg-type]


def test_client_vectors_are_checked_and_optionally_normalized() -> None:
    assert client_vector([3.0, 4.0]).tolist() == [3.0, 4.0]
    assert client_vector([3.0, 4.0], normalize=True).tolist() == pytest.approx([0.6, 0.8])
    for bad in ([], [[1.0, 2.0]], [float("nan")]):
        with pytest.raises(ValueError):
            client_vector(bad)  # type: ignore[arg-type]
