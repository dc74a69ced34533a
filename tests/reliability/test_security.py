"""Security properties testable today: hidden cache internals, no secrets anywhere a client or operator log can see
them, no client-controlled upstream (SSRF), and isolation between namespaces of one tenant.

Tenant isolation across L1 and coalescing is in ``tests/proxy/test_identity_and_credits.py``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.core.outcome import MICRO
from tests.support.processes import refused_port
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "is this private?"}]}
LLM_KEY = "sk-upstream-llm-SECRET-4f1c"
QDRANT_KEY = "qdrant-SECRET-9a7e"
ADMIN_TOKEN = "admin-SECRET-token-77c2"
WRONG_KEY = "rpk_presented-but-wrong-SECRET-0b1d"


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_cache_key_and_similarity_are_hidden_by_default(caching_proxy: ProxyServer) -> None:
    for _ in range(2):
        response = httpx.post(caching_proxy.url + CHAT, json=BODY)
        assert response.status_code == 200
        assert "X-Cache-Key" not in response.headers and "X-Cache-Similarity" not in response.headers
        assert not any("score" in name.lower() for name in response.headers)
    assert response.headers["X-Cache-Status"] == "HIT"


@pytest.fixture
def secretive(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim, tmp_path: Path) -> Iterator[ProxyServer]:
    settings = proxy_settings(qdrant_url=qdrant_shim.url, **{
        "upstreams.llm": [{"url": fake_llm_thread.url, "api_key": LLM_KEY}],
        "upstreams.qdrant.api_key": QDRANT_KEY, "admin.token": ADMIN_TOKEN, "auth.mode": "keys",
        "credits.enabled": True, "credits.sqlite_synchronous": "NORMAL", "data_dir": str(tmp_path),
        "logging.access_log": True, "logging.level": "debug",
    })
    with ProxyServer(settings, admin=True) as server:
        yield server


def test_no_secret_in_logs_errors_metrics_or_admin(fake_llm_thread: FakeLLM, secretive: ProxyServer,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    created = secretive.call(secretive.runtime.credits.keys.create("alice", "acme"))  # type: ignore[union-attr]
    secretive.call(secretive.runtime.credits.store.top_up("alice", 10 * MICRO, tenant="acme"))  # type: ignore[union-attr]
    client_key = str(created.plaintext)
    secrets = [LLM_KEY, QDRANT_KEY, ADMIN_TOKEN, WRONG_KEY, client_key]
    seen: list[str] = []
    with httpx.Client(base_url=secretive.url, timeout=10) as http:
        def call(method: str, path: str, key: str | None, **kwargs: Any) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            response = http.request(method, path, headers=headers, **kwargs)
            seen.append(response.text + str(response.headers))
            return response

        assert call("POST", CHAT, client_key, json=BODY).status_code == 200
        assert call("POST", CHAT, WRONG_KEY, json=BODY).status_code == 401
        fake_llm_thread.faults.fail_next(500)
        assert call("POST", CHAT, client_key, json={**BODY, "seed": 1}).status_code == 500
        fake_llm_thread.faults.reset_after(0)
        assert call("POST", CHAT, client_key, json={**BODY, "seed": 2}).status_code == 502
        assert call("GET", "/collections", client_key).status_code == 200
        assert call("POST", CHAT, client_key, content=b"{not json").status_code == 400
    with httpx.Client(base_url=secretive.admin_url, timeout=10) as admin:
        assert admin.get("/admin/config").status_code == 401
        bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for path in ("/admin/config", "/admin/backends", "/metrics", "/admin/stats", "/admin/keys"):
            response = admin.get(path, headers=bearer)
            assert response.status_code == 200, path
            seen.append(response.text)
    seen.append(secretive.runtime.metrics.exposition().decode())
    seen.append(caplog.text)
    seen.extend(str(record.__dict__) for record in caplog.records)
    everything = "\n".join(seen)
    for secret in secrets:
        assert secret not in everything, f"{secret[:12]}... leaked"


def test_credentials_in_an_upstream_url_never_leak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    settings = proxy_settings(f"http://ops:URL-SECRET-5e@127.0.0.1:{refused_port()}", **{"cache.enabled": False})
    with ProxyServer(settings) as server:
        response = httpx.post(server.url + CHAT, json=BODY, timeout=10)
        assert response.status_code == 502
        exposition = server.runtime.metrics.exposition().decode()
    assert "URL-SECRET" not in response.text
    assert "URL-SECRET" not in caplog.text and "URL-SECRET" not in exposition


@pytest.fixture
def decoy() -> Iterator[FakeLLM]:
    with FakeLLM() as evil:
        yield evil


def test_host_and_forwarded_headers_cannot_redirect_the_proxy(fake_llm_thread: FakeLLM, decoy: FakeLLM,
                                                              proxy: ProxyServer) -> None:
    evil = decoy.url.removeprefix("http://")
    for headers in ({"Host": evil}, {"X-Forwarded-Host": evil}, {"Forwarded": f"host={evil}"},
                    {"X-Original-URL": decoy.url + CHAT}, {"X-Rewrite-URL": decoy.url + CHAT}):
        assert httpx.post(proxy.url + CHAT, json=BODY, headers=headers).status_code == 200
    assert decoy.log.count() == 0
    assert fake_llm_thread.log.count(CHAT) == 5


def test_absolute_form_request_target_stays_on_the_configured_upstream(fake_llm_thread: FakeLLM,
                                                                      decoy: FakeLLM) -> None:
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    with ProxyServer(proxy_settings(fake_llm_thread.url, **{"cache.enabled": False})) as server:
        for target in (decoy.url + CHAT, "http.evil.example://x" + CHAT):
            head = (f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            status = _raw(server.settings.server.port, head + body).split(b"\r\n", 1)[0]
            assert status.split()[1] in (b"200", b"400"), (target, status)
    assert decoy.log.count() == 0


def test_namespaces_of_one_tenant_do_not_share_entries(caching_proxy: ProxyServer) -> None:
    def status(namespace: str) -> str:
        response = httpx.post(caching_proxy.url + CHAT, json=BODY, headers={"X-Ragproxy-Namespace": namespace})
        return str(response.headers["X-Cache-Status"])

    assert [status("a"), status("b"), status("a"), status("b")] == ["MISS", "MISS", "HIT", "HIT"]


def test_backend_credentials_never_reach_error_bodies_logs_or_metrics(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://llm-user:hunter2-secret@127.0.0.1:{refused_port()}"
    settings = proxy_settings(url, **{"cache.enabled": False, "upstreams.connect_timeout_s": 0.5})
    with caplog.at_level(logging.DEBUG), ProxyServer(settings, admin=True) as server:
        reply = httpx.post(server.url + CHAT, json=BODY, timeout=30)
        metrics = httpx.get(server.admin_url + "/metrics", timeout=30).text
        backends = httpx.get(server.admin_url + "/admin/backends", timeout=30).text
    assert reply.status_code in (502, 503)
    for seen in (reply.text, metrics, backends, caplog.text):
        assert "hunter2-secret" not in seen and "llm-user" not in seen
