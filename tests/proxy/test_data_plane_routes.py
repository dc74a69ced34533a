"""The data plane's own routing (:class:`proxy.assembly.app.DataPlane`): what goes to which pipeline, and JSON errors in
the route's dialect for paths and methods it does not serve."""

from __future__ import annotations

import httpx

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim


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


def test_only_allowed_v1_paths_pass_through(proxy: ProxyServer, fake_llm_thread: FakeLLM) -> None:
    assert httpx.get(proxy.url + "/v1/models").status_code == 200
    assert httpx.get(proxy.url + "/v1/models/fake-model").status_code in (200, 404)  # the upstream's to answer
    listing = httpx.get(proxy.url + "/v1/chat/completions")  # another method on an LLM route: stored completions
    assert listing.status_code == 405 and listing.headers["Allow"] == "POST"
    assert listing.json()["error"]["code"] == "method_not_allowed"
    for method, path in (("POST", "/v1/chat/completions/"), ("GET", "/v1/files"), ("POST", "/v1/moderations"),
                         ("DELETE", "/v1/models/fake-model"), ("GET", "/v1/models/a/b")):
        refused = httpx.request(method, proxy.url + path, json={})
        assert refused.status_code == 404, (method, path)
        assert "upstreams.llm_passthrough" in refused.json()["error"]["message"]
    seen = {(r.method, r.path) for r in fake_llm_thread.log.entries}  # health probes read /v1/models too
    assert seen == {("GET", "/v1/models"), ("GET", "/v1/models/fake-model")}


def test_an_operator_allows_more_pass_through(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim) -> None:
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{
        "cache.enabled": False, "upstreams.llm_passthrough": ["POST /v1/moderations", "* /v1/things/*"]})
    with ProxyServer(settings) as server:
        httpx.post(server.url + "/v1/moderations", json={"input": "x"})  # the fake answers 404: it has no such API
        httpx.delete(server.url + "/v1/things/abc")
        refused = httpx.get(server.url + "/v1/models/fake-model")
        assert refused.status_code == 404 and "upstreams.llm_passthrough" in refused.text, "the defaults are replaced"
    seen = {(r.method, r.path) for r in fake_llm_thread.log.entries}
    assert seen - {("GET", "/v1/models")} == {("POST", "/v1/moderations"), ("DELETE", "/v1/things/abc")}


def test_only_qdrant_rows_reach_qdrant(proxy: ProxyServer, qdrant_shim: QdrantShim) -> None:
    assert httpx.get(proxy.url + "/collections").status_code == 200
    kept = httpx.get(proxy.url + "/cluster")
    assert kept.status_code == 403 and "operator" in kept.json()["status"]["error"]
    for method, path in (("GET", "/collections/docs/points"), ("POST", "/collections/docs/points/explode"),
                         ("GET", "/livez"), ("OPTIONS", "/collections")):
        unknown = httpx.request(method, proxy.url + path)
        assert unknown.status_code == 404 and "error" in unknown.json()["status"], (method, path)
    assert [r.path for r in qdrant_shim.log.entries] == ["/collections"]
