"""The data plane's own routing (:class:`proxy.app.DataPlane`): what goes to which pipeline, and JSON errors in
the route's dialect for paths and methods it does not serve."""

from __future__ import annotations

import httpx

from proxy.doubles.llm_server import FakeLLM
from proxy.doubles.qdrant_shim import QdrantShim
from tests.support.proxy_server import ProxyServer


def test_unknown_paths_are_404_in_each_dialect(proxy: ProxyServer) -> None:
    openai_side = httpx.get(proxy.url + "/v1")
    assert openai_side.status_code == 404
    assert openai_side.json()["error"]["code"] == "not_found"
    qdrant_side = httpx.post(proxy.url + "/nothing/here", json={})
    assert qdrant_side.status_code == 404
    assert "error" in qdrant_side.json()["status"]
    near_miss = httpx.get(proxy.url + "/collectionsX")  # a prefix must end at a path segment
    assert near_miss.status_code == 404


def test_wrong_method_on_a_fixed_route_is_405_with_allow(proxy: ProxyServer) -> None:
    for path in ("/healthz", "/readyz", "/"):
        response = httpx.delete(proxy.url + path)
        assert response.status_code == 405, path
        assert set(response.headers["Allow"].split(",")) == {"GET", "HEAD"}
        assert response.json()["status"]["error"]


def test_head_on_health_has_no_body(proxy: ProxyServer) -> None:
    response = httpx.head(proxy.url + "/healthz")
    assert response.status_code == 200
    assert response.content == b""


def test_other_v1_paths_and_methods_pass_through(proxy: ProxyServer, fake_llm_thread: FakeLLM) -> None:
    assert httpx.get(proxy.url + "/v1/models").status_code == 200
    httpx.get(proxy.url + "/v1/chat/completions")  # a chat route with another method is the upstream's to answer
    httpx.post(proxy.url + "/v1/chat/completions/", json={})  # so is a path that only looks like a chat route
    seen = [(r.method, r.path) for r in fake_llm_thread.log.entries]
    assert ("GET", "/v1/models") in seen
    assert ("GET", "/v1/chat/completions") in seen
    assert ("POST", "/v1/chat/completions/") in seen


def test_qdrant_prefixes_reach_qdrant(proxy: ProxyServer, qdrant_shim: QdrantShim) -> None:
    assert httpx.get(proxy.url + "/collections").status_code == 200
    httpx.get(proxy.url + "/cluster")
    paths = [r.path for r in qdrant_shim.log.entries]
    assert "/collections" in paths and "/cluster" in paths
