"""Header hygiene between client, proxy and upstream (RFC 9110 hop-by-hop rules, credentials, tracing ids)."""

from __future__ import annotations

import httpx

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_request_headers_cleaned_and_enriched(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    response = httpx.post(proxy.url + "/v1/chat/completions", json=BODY, headers={
        "Authorization": "Bearer client-secret", "Connection": "keep-alive, X-Hop", "X-Hop": "1",
        "Keep-Alive": "timeout=5", "TE": "trailers", "X-Request-ID": "req-123", "traceparent": TRACEPARENT,
        "X-Custom": "kept", "X-Forwarded-For": "6.6.6.6",
    })
    assert response.status_code == 200
    assert response.headers["X-Request-ID"] == "req-123"
    seen = fake_llm_thread.log.for_path(CHAT)[-1].headers
    assert "X-Hop" not in seen and "Keep-Alive" not in seen and "TE" not in seen
    assert "Authorization" not in seen, "the client's key must never reach the upstream"
    assert "X-Custom" not in seen, "headers to the upstream are an allow-list"
    assert seen["X-Request-ID"] == "req-123"
    assert seen["traceparent"] == TRACEPARENT
    assert seen["X-Forwarded-For"] == "127.0.0.1", "an untrusted client cannot forge the forwarding chain"
    assert seen["X-Forwarded-Proto"] == "http"
    assert seen["Host"] == fake_llm_thread.url.removeprefix("http://")


def test_request_id_generated_when_missing_or_unsafe(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    first = httpx.post(proxy.url + "/v1/chat/completions", json=BODY)
    unsafe = httpx.post(proxy.url + "/v1/chat/completions", json=BODY, headers={"X-Request-ID": "a b<script>"})
    assert len(first.headers["X-Request-ID"]) == 32
    assert unsafe.headers["X-Request-ID"] != "a b<script>"
    assert fake_llm_thread.log.for_path(CHAT)[-1].headers["X-Request-ID"] == unsafe.headers["X-Request-ID"]


def test_upstream_keys_injected(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim) -> None:
    settings = proxy_settings(qdrant_url=qdrant_shim.url, **{
        "upstreams.llm": [{"url": fake_llm_thread.url, "api_key": "upstream-llm-key"}],
        "upstreams.qdrant.api_key": "upstream-qdrant-key", "cache.enabled": False,
    })
    with ProxyServer(settings) as server:
        httpx.post(server.url + "/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer mine"})
        httpx.get(server.url + "/collections", headers={"api-key": "client-qdrant-key"})
    assert fake_llm_thread.log.for_path(CHAT)[-1].headers["Authorization"] == "Bearer upstream-llm-key"
    assert qdrant_shim.log.for_path("/collections")[-1].headers["api-key"] == "upstream-qdrant-key"


def test_response_hop_by_hop_removed(proxy: ProxyServer) -> None:
    response = httpx.get(proxy.url + "/v1/models")
    assert response.status_code == 200
    assert "Keep-Alive" not in response.headers
    assert response.headers["content-type"].startswith("application/json")
