"""Broken LLM upstreams: slow, 5xx, resetting mid-stream, refusing connections.

The client gets the proper error quickly (no hung connections: every replica's in-flight count returns to zero),
a POST is retried only when nothing reached the upstream (connection refused) — proven with the doubles' request
logs — and each replica has its own circuit breaker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from loadtest.harness import child
from tests.support.processes import free_port, refused_port
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
def pair() -> Iterator[tuple[FakeLLM, FakeLLM]]:
    with FakeLLM() as first, FakeLLM() as second:
        yield first, second


def _proxy(urls: list[str], **overrides: Any) -> ProxyServer:
    values: dict[str, Any] = {"cache.enabled": False, "upstreams.health_interval_s": 60.0, **overrides}
    return ProxyServer(proxy_settings(urls, **values))


def _post(server: ProxyServer, body: dict[str, Any] = BODY) -> httpx.Response:
    return httpx.post(server.url + CHAT, json=body, timeout=15)


def _drained(server: ProxyServer) -> None:
    """Every replica's in-flight count is back to zero (no hung upstream call)."""
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while time.monotonic() < deadline:
        if all(b.in_flight == 0 for b in server.runtime.backends.backends):
            return
        time.sleep(0.02)
    raise AssertionError([b.in_flight for b in server.runtime.backends.backends])


def test_post_is_not_retried_after_the_upstream_received_it(pair: tuple[FakeLLM, FakeLLM]) -> None:
    first, second = pair
    with _proxy([first.url, second.url]) as server:
        first.faults.reset_after(0)  # headers sent, then RST: the request had reached the upstream
        response = _post(server)
        assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_reset"
        first.faults.fail_next(500)
        assert _post(server).status_code == 500
        first.faults.hang_next()
    assert first.log.count(CHAT) == 2
    assert second.log.count(CHAT) == 0, "a POST that reached one replica must never be resent to another"


def test_a_response_head_over_64_kib_is_a_502_not_held(fake_llm_thread: FakeLLM) -> None:
    fake_llm_thread.faults.fail_next(500, headers={"X-Huge": "v" * 100_000})
    with _proxy([fake_llm_thread.url]) as server:
        response = _post(server)
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == "upstream_reset" and "head exceeds 65536 bytes" in error["message"]
        assert _post(server).status_code == 200  # the next answer, of a normal size, passes
        _drained(server)


def test_timeout_is_not_retried_either(pair: tuple[FakeLLM, FakeLLM]) -> None:
    first, second = pair
    first.faults.hang_next()
    with _proxy([first.url, second.url], **{"upstreams.read_timeout_s": 0.3}) as server:
        response = _post(server)
        assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_timeout"
        _drained(server)
    assert (first.log.count(CHAT), second.log.count(CHAT)) == (1, 0)


def test_refused_connection_is_retried_once_on_the_next_replica(fake_llm_thread: FakeLLM) -> None:
    dead = f"http://127.0.0.1:{refused_port()}"
    with _proxy([dead, fake_llm_thread.url]) as server:
        for _ in range(3):
            assert _post(server).status_code == 200
        down = server.runtime.backends.backends[0]
        assert not down.healthy
        _drained(server)
    assert fake_llm_thread.log.count(CHAT) == 3


def test_every_replica_refusing_is_a_quick_502_then_a_fast_503() -> None:
    dead = [f"http://127.0.0.1:{refused_port()}" for _ in range(2)]
    with _proxy(dead, **{"upstreams.breaker_failures": 2, "upstreams.breaker_open_s": 30}) as server:
        statuses = [_post(server).status_code for _ in range(4)]
        assert statuses[0] == 502
        fast = _post(server)
        assert fast.status_code == 503 and fast.json()["error"]["code"] == "upstream_circuit_open"
        assert int(fast.headers["Retry-After"]) > 0


def test_breaker_is_per_replica(pair: tuple[FakeLLM, FakeLLM]) -> None:
    first, second = pair
    first.faults.fail_next(503, times=3)
    overrides = {"upstreams.breaker_failures": 3, "upstreams.breaker_open_s": 5.0}
    with _proxy([first.url, second.url], **overrides) as server:
        assert [_post(server).status_code for _ in range(3)] == [503, 503, 503]
        opened = time.monotonic()  # open for 5 s: room for a loaded machine before the half-open probe
        a, b = server.runtime.backends.backends
        assert a.breaker.state.value == "open" and b.breaker.state.value == "closed"
        assert [_post(server).status_code for _ in range(3)] == [200] * 3
        assert (first.log.count(CHAT), second.log.count(CHAT)) == (3, 3), "an open replica gets nothing"
        time.sleep(max(0.0, opened + 5.1 - time.monotonic()))
        assert _post(server).status_code == 200  # the half-open probe goes to the first replica and closes it
        assert first.log.count(CHAT) == 4 and a.breaker.state.value == "closed"


def test_slow_upstream_is_cut_off_by_the_read_timeout(fake_llm_thread: FakeLLM) -> None:
    fake_llm_thread.latency_s = 3.0
    with _proxy([fake_llm_thread.url], **{"upstreams.read_timeout_s": 0.3}) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=10)
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(**BODY)  # type: ignore[call-overload]
        assert raised.value.status_code == 504
        _drained(server)


def test_stream_that_stalls_mid_way_ends_with_an_error_event(fake_llm_thread: FakeLLM) -> None:
    fake_llm_thread.chunk_latency_s = 1.0
    with _proxy([fake_llm_thread.url], **{"upstreams.read_timeout_s": 0.3}) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=10)
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            for _ in client.chat.completions.create(stream=True, **BODY):  # type: ignore[call-overload]
                pass
        _drained(server)


def test_reset_mid_stream_is_never_stored(fake_llm_thread: FakeLLM) -> None:
    with ProxyServer(proxy_settings(fake_llm_thread.url, **{"cache.l3.enabled": False})) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=10)
        for kind in range(2):
            fake_llm_thread.faults.reset_after(2)
            with pytest.raises((openai.APIError, httpx.HTTPError)):
                if kind == 0:
                    for _ in client.chat.completions.create(stream=True, **BODY):  # type: ignore[call-overload]
                        pass
                else:
                    client.chat.completions.create(**BODY)  # type: ignore[call-overload]
        _drained(server)
        assert server.call(server.l1.stats()).entries == 0
        assert _post(server).headers["X-Cache-Status"] == "MISS", "the broken answers were not cached"


def test_per_request_500s_do_not_open_the_breaker_for_everyone(pair: tuple[FakeLLM, FakeLLM]) -> None:
    first, _ = pair
    with _proxy([first.url], **{"upstreams.breaker_failures": 3, "upstreams.breaker_open_s": 30}) as server:
        first.faults.fail_next(500, times=3)  # what a malformed request can make a real backend answer
        assert [_post(server).status_code for _ in range(3)] == [500] * 3
        assert _post(server).status_code == 200, "a well-formed request from another client must still be served"


def test_qdrant_down_is_a_quick_502_in_qdrant_shape_and_not_ready(fake_llm_thread: FakeLLM) -> None:
    settings = proxy_settings(fake_llm_thread.url, f"http://127.0.0.1:{refused_port()}", **{"cache.enabled": False})
    with ProxyServer(settings) as server:
        search = httpx.post(server.url + "/collections/docs/points/search", json={"vector": [0.1, 0.2], "limit": 3})
        assert search.status_code == 502 and isinstance(search.json()["status"]["error"], str)
        assert httpx.get(server.url + "/collections").status_code == 502
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["qdrant"].startswith("unreachable")
        assert _post(server).status_code == 200, "the LLM side is unaffected"


def test_readyz_reports_an_open_breaker(pair: tuple[FakeLLM, FakeLLM]) -> None:
    first, second = pair
    with _proxy([first.url, second.url], **{"upstreams.breaker_failures": 1, "upstreams.breaker_open_s": 30}) as server:
        first.faults.fail_next(503)
        assert _post(server).status_code == 503
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 200, "the other replica still serves"
        assert ready.json()["degraded"] == {f"llm {first.url}": "breaker open"}
        second.faults.fail_next(503)
        assert _post(server).status_code == 503
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["llm"] == "breaker open"
        assert len(ready.json()["degraded"]) == 2


def test_a_cancelled_half_open_probe_does_not_keep_the_replica_refused(fake_llm_thread: FakeLLM) -> None:
    """The one request let through after an outage is abandoned by its client: the replica is tried again at once
    (not refused for good while /readyz says ready)."""
    overrides = {"upstreams.breaker_failures": 1, "upstreams.breaker_open_s": 2.0}
    with _proxy([fake_llm_thread.url], **overrides) as server:
        fake_llm_thread.faults.fail_next(503)
        assert _post(server).status_code == 503
        time.sleep(2.1)
        fake_llm_thread.latency_s = 5.0
        with pytest.raises(httpx.ReadTimeout):  # the probe: its client hangs up
            httpx.post(server.url + CHAT, json=BODY, timeout=0.3)
        fake_llm_thread.latency_s = 0.0
        time.sleep(0.1)
        assert _post(server).status_code == 200
        assert server.runtime.backends.backends[0].breaker.state.value == "closed"
        _drained(server)


def test_a_restarted_replica_serves_as_soon_as_it_is_back() -> None:
    """The only replica is killed, its breaker opens, and it comes back: the first health check that succeeds
    half-opens the breaker, so requests succeed within a probe period, not a breaker period (5 s by default)."""
    port = free_port()
    command = ["-m", "upstream_doubles.llm_server", "--port", str(port)]
    overrides = {"upstreams.health_interval_s": 5.0}  # the defaults: 5 s health checks, breaker open for 5 s
    with child(command, port) as first, _proxy([f"http://127.0.0.1:{port}"], **overrides) as server:
        assert _post(server).status_code == 200
        first.kill()
        first.wait()
        statuses = [_post(server).status_code for _ in range(8)]
        assert statuses[-1] == 503 and set(statuses) <= {502, 503}, statuses  # refused, then the breaker is open
        with child(command, port):
            back = time.monotonic()
            while (status := _post(server).status_code) != 200 and time.monotonic() - back < 10:
                time.sleep(0.05)
            # within a few probe periods (0.5 s while down), not a breaker period (5 s)
            assert status == 200 and time.monotonic() - back < 4, time.monotonic() - back
            assert [_post(server).status_code for _ in range(10)] == [200] * 10
