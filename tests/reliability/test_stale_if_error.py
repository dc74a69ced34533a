"""Stale-if-error for stale-tolerant namespaces (``proxy.answers.stale``), through the real data plane.

Each proxy switches it on through configuration (``cache.stale.namespaces``), as ``proxy/assembly/pipelines.py`` wires
it;
most tests watch the chat pipeline's stale store to know when an answer was kept.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.answers.stale import StaleIfError, StaleStore
from tests.support.proxy_server import ProxyServer, proxy_settings
from tiers.entry import CachedResponse
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "what is stale?"}]}
TOLERANT = {"X-Ragproxy-Namespace": "faq"}


def _store(server: ProxyServer) -> StaleStore:
    """Where the chat pipeline keeps the answers it may serve stale."""
    return server.stage(StaleIfError).store


@pytest.fixture
def served(fake_llm_thread: FakeLLM) -> Iterator[tuple[ProxyServer, StaleStore]]:
    settings = proxy_settings(fake_llm_thread.url, **{
        "cache.stale.namespaces": ["faq"], "cache.stale.max_entries": 100, "cache.l3.enabled": False,
        "upstreams.breaker_failures": 50, "upstreams.read_timeout_s": 0.5})
    with ProxyServer(settings) as server:
        yield server, _store(server)


def _post(server: ProxyServer, headers: dict[str, str], body: dict[str, Any] = BODY) -> httpx.Response:
    return httpx.post(server.url + CHAT, json=body, headers=headers, timeout=10)


def _kept(store: StaleStore, count: int = 1) -> None:
    """Wait for the finish callbacks (they run after the client has the last byte)."""
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while len(store) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(store) == count


def _expire_l1(server: ProxyServer) -> None:
    """What a passed TTL does: the tiers no longer hold the answer."""
    server.call(server.l1.store.clear())


def test_upstream_error_serves_the_expired_answer_with_a_stale_header(
        fake_llm_thread: FakeLLM, served: tuple[ProxyServer, StaleStore]) -> None:
    server, store = served
    fresh = _post(server, TOLERANT)
    assert fresh.status_code == 200 and fresh.headers["X-Cache-Status"] == "MISS"
    _kept(store)
    _expire_l1(server)
    for arm in (lambda: fake_llm_thread.faults.fail_next(503), lambda: fake_llm_thread.faults.fail_next(500),
                lambda: fake_llm_thread.faults.reset_after(0), lambda: fake_llm_thread.faults.hang_next()):
        arm()
        stale = _post(server, TOLERANT)
        assert stale.status_code == 200, stale.text
        assert stale.headers["X-Cache-Status"] == "STALE" and stale.headers["X-Cache-Stale"] == "true"
        assert stale.headers["Warning"].startswith("110")
        assert stale.json()["choices"] == fresh.json()["choices"]
    assert all(b.in_flight == 0 for b in server.runtime.backends.backends), "replaced replies are released"
    assert server.call(server.l1.stats()).entries == 0, "a stale answer is not stored again as fresh"


def test_stale_answer_replays_as_a_stream_for_the_sdk(
        fake_llm_thread: FakeLLM, served: tuple[ProxyServer, StaleStore]) -> None:
    server, store = served
    fresh = _post(server, TOLERANT)
    _kept(store)
    _expire_l1(server)
    fake_llm_thread.faults.fail_next(502)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, default_headers=TOLERANT)
    chunks = list(client.chat.completions.create(stream=True, **BODY))  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == fresh.json()["choices"][0]["message"]["content"]


def test_other_namespaces_get_the_error(fake_llm_thread: FakeLLM, served: tuple[ProxyServer, StaleStore]) -> None:
    server, store = served
    plain = {"X-Ragproxy-Namespace": "live"}
    assert _post(server, plain).status_code == 200
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while server.call(server.l1.stats()).entries == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # the stale store would have been fed right after L1 (same finish callbacks)
    assert len(store) == 0, "answers of namespaces that are not stale-tolerant are not kept"
    _expire_l1(server)
    fake_llm_thread.faults.fail_next(503)
    assert _post(server, plain).status_code == 503


def test_no_cache_request_is_never_served_stale(
        fake_llm_thread: FakeLLM, served: tuple[ProxyServer, StaleStore]) -> None:
    server, store = served
    assert _post(server, TOLERANT).status_code == 200
    _kept(store)
    _expire_l1(server)
    fake_llm_thread.faults.fail_next(503)
    assert _post(server, {**TOLERANT, "Cache-Control": "no-cache"}).status_code == 503


def test_a_client_error_is_not_hidden(fake_llm_thread: FakeLLM, served: tuple[ProxyServer, StaleStore]) -> None:
    server, store = served
    assert _post(server, TOLERANT).status_code == 200
    _kept(store)
    _expire_l1(server)
    fake_llm_thread.faults.fail_next(400)
    assert _post(server, TOLERANT).status_code == 400


def test_all_replicas_down_serves_stale() -> None:
    llm = FakeLLM().start_in_thread()
    settings = proxy_settings([llm.url], **{"cache.stale.namespaces": ["faq"], "cache.l3.enabled": False,
                                            "upstreams.health_interval_s": 60})
    with ProxyServer(settings) as server:
        store = _store(server)
        assert _post(server, TOLERANT).status_code == 200
        _kept(store)
        _expire_l1(server)
        llm.stop_thread()  # connection refused from now on
        response = _post(server, TOLERANT)
        assert response.status_code == 200 and response.headers["X-Cache-Status"] == "STALE"
        assert _post(server, {"X-Ragproxy-Namespace": "live"}).status_code == 502


def test_stale_store_is_bounded_and_forgets_old_answers() -> None:
    now = [0.0]
    store = StaleStore(max_entries=3, max_bytes=10_000, max_stale_s=100.0, clock=lambda: now[0])
    for i in range(10):
        assert store.keep(f"k{i}", CachedResponse(body=b"x" * 100, kind="chat"))
    assert len(store) == 3 and store.get("k0") is None and store.get("k9") is not None
    assert not store.keep("huge", CachedResponse(body=b"x" * 20_000, kind="chat"))
    for i in range(50):
        store.keep(f"b{i}", CachedResponse(body=b"y" * 3_000, kind="chat"))
        assert store.bytes <= 10_000
    now[0] = 101.0
    assert store.get("b49") is None and len(store) < 3


def test_configured_namespace_is_served_stale(fake_llm_thread: FakeLLM) -> None:
    """The same behaviour switched on by configuration alone (``cache.stale.namespaces``)."""
    settings = proxy_settings(fake_llm_thread.url, **{"cache.stale.namespaces": ["faq"], "cache.l3.enabled": False})
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "opening hours?"}]}
    headers = {"x-ragproxy-namespace": "faq", "x-ragproxy-ttl": "1"}
    with ProxyServer(settings) as server:
        fresh = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers)
        time.sleep(1.2)
        fake_llm_thread.faults.fail_next(503)
        stale = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers)
        assert stale.status_code == 200 and stale.headers["X-Cache-Status"] == "STALE"
        assert stale.json() == fresh.json()
        fake_llm_thread.faults.fail_next(503)
        other = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"x-ragproxy-ttl": "1"})
        assert other.status_code == 503, "namespaces not named stay strict"
