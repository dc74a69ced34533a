"""Bad input and broken upstreams get clear errors in the upstream's own shape — never a 500 or a traceback."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest

from tests.support.processes import refused_port
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def _openai_error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    return dict(error)


def test_malformed_json_is_400_in_openai_shape(proxy: ProxyServer) -> None:
    for raw, code in ((b"{bad", "invalid_json"), (b"[1, 2]", "invalid_json"), (b"", "invalid_json"),
                      (b'{"a": "\xff"}', "invalid_json"), (b"[" * 5000 + b"]" * 5000, "nesting_too_deep")):
        error = _openai_error(httpx.post(proxy.url + "/v1/chat/completions", content=raw,
                                         headers={"Content-Type": "application/json"}), 400)
        assert error["code"] == code


def test_sdk_sees_bad_request(proxy: ProxyServer) -> None:
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.post("/chat/completions", body=[1, 2], cast_to=object)


def test_oversize_body_is_413(fake_llm_thread: FakeLLM) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"server.max_body_bytes": 2048, "cache.enabled": False})
    with ProxyServer(settings) as server:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
        _openai_error(httpx.post(server.url + "/v1/chat/completions", json=big), 413)
        assert fake_llm_thread.log.count("/v1/chat/completions") == 0


def test_unknown_route_is_json_404(proxy: ProxyServer) -> None:
    response = httpx.get(proxy.url + "/nothing/here")
    assert response.status_code == 404
    assert "error" in response.json()["status"]


def test_qdrant_path_traversal_refused(proxy: ProxyServer, qdrant_shim: QdrantShim) -> None:
    for path in ("/collections/%2e%2e/admin", "/collections/a%2fb/points", "/collections/x/../../etc"):
        response = httpx.get(proxy.url + path)
        assert response.status_code in (400, 404), path
        assert "status" in response.json()
    assert qdrant_shim.log.count() == 0


def test_upstream_unreachable_is_502() -> None:
    settings = proxy_settings(f"http://127.0.0.1:{refused_port()}", **{"cache.enabled": False})
    with ProxyServer(settings) as server:
        error = _openai_error(httpx.post(server.url + "/v1/chat/completions", json=BODY), 502)
        assert error["code"] == "upstream_unreachable"


def test_failover_to_next_replica_when_refused(fake_llm_thread: FakeLLM) -> None:
    settings = proxy_settings([f"http://127.0.0.1:{refused_port()}", fake_llm_thread.url], **{"cache.enabled": False})
    with ProxyServer(settings) as server:
        assert httpx.post(server.url + "/v1/chat/completions", json=BODY).status_code == 200


def test_upstream_timeout_is_504(fake_llm_thread: FakeLLM) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"upstreams.read_timeout_s": 0.3, "cache.enabled": False})
    fake_llm_thread.faults.hang_next()
    with ProxyServer(settings) as server:
        started = time.monotonic()
        error = _openai_error(httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=10), 504)
        assert error["code"] == "upstream_timeout"
        assert time.monotonic() - started < 5


def test_upstream_error_status_passes_through(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    fake_llm_thread.faults.fail_next(429, message="slow down")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.RateLimitError, match="slow down"):
        client.chat.completions.create(**BODY)  # type: ignore[call-overload]


def test_reset_mid_stream_surfaces_as_sdk_error(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    fake_llm_thread.faults.reset_after(chunks=2)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in client.chat.completions.create(stream=True, **BODY):  # type: ignore[call-overload]
            pass


def test_client_disconnect_cancels_upstream(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    fake_llm_thread.chunk_latency_s = 0.2
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n")
    body = b'{"model": "fake-model", "stream": true, "messages": [{"role": "user", "content": "long answer"}]}'
    with socket.create_connection(("127.0.0.1", proxy.settings.server.port)) as sock:
        sock.sendall(request % len(body) + body)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    backend = proxy.runtime.backends.backends[0]
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while backend.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.in_flight == 0, "the upstream call must end when the client goes away"


def test_a_client_gone_before_the_answer_leaves_nothing_in_flight(fake_llm_thread: FakeLLM,
                                                                   proxy: ProxyServer) -> None:
    fake_llm_thread.latency_s = 0.5
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n")
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "slow answer"}]}'
    backend = proxy.runtime.backends.backends[0]
    with socket.create_connection(("127.0.0.1", proxy.settings.server.port)) as sock:
        sock.sendall(request % len(body) + body)
        deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
        while not backend.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert backend.in_flight == 1
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while backend.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.in_flight == 0, "a request cancelled while waiting for the upstream is no longer in flight"


def test_upstream_breaker_fails_fast_then_recovers(fake_llm_thread: FakeLLM) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"cache.enabled": False, "upstreams.breaker_failures": 3,
                                                       "upstreams.breaker_open_s": 5.0})
    fake_llm_thread.faults.fail_next(503, times=3)
    with ProxyServer(settings) as server:
        for _ in range(3):
            assert httpx.post(server.url + "/v1/chat/completions", json=BODY).status_code == 503
        opened = time.monotonic()  # open for 5 s: room for a loaded machine between here and the fast refusal
        calls = fake_llm_thread.log.count("/v1/chat/completions")
        fast = httpx.post(server.url + "/v1/chat/completions", json=BODY)
        error = _openai_error(fast, 503)
        assert error["code"] == "upstream_circuit_open" and fast.headers["Retry-After"]
        assert fake_llm_thread.log.count("/v1/chat/completions") == calls, "an open breaker sends nothing upstream"
        time.sleep(max(0.0, opened + 5.1 - time.monotonic()))
        assert httpx.post(server.url + "/v1/chat/completions", json=BODY).status_code == 200
