"""Fixtures for the data plane: the proxy in front of the upstream doubles."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim


@pytest.fixture
def proxy(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim) -> Iterator[ProxyServer]:
    """A proxy with caching off, in front of a fake LLM and the Qdrant shim: pure pass-through."""
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{"cache.enabled": False})
    with ProxyServer(settings) as server:
        yield server


@pytest.fixture
def caching_proxy(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim) -> Iterator[ProxyServer]:
    """A proxy with its default (embedded) caches on."""
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url)
    with ProxyServer(settings) as server:
        yield server
