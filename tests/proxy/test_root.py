"""``GET /`` on the data port: Qdrant's own root when a Qdrant upstream is configured (the real qdrant-client reads
the server version there on connect), otherwise what the proxy is and where its admin and docs are."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from qdrant_client import QdrantClient
from qdrant_client.common.version_check import get_server_version

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import VERSION, QdrantShim


@pytest.fixture
def proxy_without_qdrant(fake_llm_thread: FakeLLM) -> Iterator[ProxyServer]:
    with ProxyServer(proxy_settings(fake_llm_thread.url)) as server:
        yield server


def test_without_qdrant_root_describes_the_proxy(proxy_without_qdrant: ProxyServer) -> None:
    response = httpx.get(proxy_without_qdrant.url + "/")
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    about = response.json()
    admin = f"http://127.0.0.1:{proxy_without_qdrant.settings.admin.port}"
    assert about["service"] == "ragproxy"
    assert about["openai_base_url"] == "/v1"
    assert about["admin"] == {"dashboard": f"{admin}/admin/ui", "openapi": f"{admin}/admin/openapi.json"}
    assert "--qdrant-upstream" in about["qdrant"]
    head = httpx.head(proxy_without_qdrant.url + "/")
    assert head.status_code == 200 and head.content == b""


def test_without_qdrant_a_qdrant_client_finds_no_server_version(proxy_without_qdrant: ProxyServer) -> None:
    """qdrant-client's own connect-time check: no version, rather than an incompatible one (the proxy's release)."""
    assert get_server_version(proxy_without_qdrant.url, {}, None, 5) is None


def test_with_qdrant_root_is_qdrants(proxy: ProxyServer, qdrant_shim: QdrantShim) -> None:
    through = httpx.get(proxy.url + "/")
    assert through.status_code == 200
    assert through.json() == httpx.get(qdrant_shim.url + "/").json()
    assert get_server_version(proxy.url, {}, None, 5) == VERSION  # what QdrantClient() checks when it connects
    client = QdrantClient(url=proxy.url, check_compatibility=False)
    try:
        assert client.info().version == VERSION
    finally:
        client.close()
