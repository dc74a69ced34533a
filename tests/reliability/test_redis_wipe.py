"""A shared Redis restarted without persistence after the proxy started (so it came back empty) is noticed: the
replica logs it, ``/readyz`` answers 503, and credits and keys run in the outage mode (outage allowance, journal,
keys verified lately) instead of believing the empty Redis. It used to go unnoticed: 402 ("no credits") for every
user, then 401 ("unknown key") once the verified keys aged out."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.processes import VOLATILE, RedisServer
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer.start(None)
    yield server
    server.stop()


def _ready(url: str) -> httpx.Response:
    return httpx.get(url + "/readyz", timeout=10)


def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("not within the time allowed")


def test_a_redis_that_came_back_empty_is_an_outage_not_a_truth(fake_llm_thread: FakeLLM,
                                                                redis: RedisServer) -> None:
    overrides: dict[str, Any] = {"redis.url": redis.url, "redis.wipe_check_s": 0.2, "auth.mode": "keys",
                                 "credits.enabled": True, "cache.enabled": False}
    settings = proxy_settings(fake_llm_thread.url, **overrides)
    with ProxyServer(settings, admin=True) as server, httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        ann = admin.post("/admin/keys", json={"user": "ann", "tenant": "acme"}).json()["key"]
        assert admin.post("/admin/credits/ann", json={"amount": 100, "tenant": "acme"}).status_code == 200
        headers = {"Authorization": f"Bearer {ann}"}
        assert httpx.post(server.url + CHAT, json=BODY, headers=headers, timeout=30).status_code == 200
        assert _ready(server.url).json()["checks"]["redis"] == "ok"

        redis.process.terminate()
        redis.process.wait(timeout=10)
        empty = RedisServer.start(redis.port, *VOLATILE)  # same port, no data, keeps nothing
        try:
            _until(lambda: _ready(server.url).status_code == 503)
            assert "lost its data" in _ready(server.url).json()["checks"]["redis"]
            answer = httpx.post(server.url + CHAT, json=BODY, headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text  # on the outage allowance: not 429 for an empty balance
        finally:
            empty.stop()


def test_a_response_made_while_redis_is_down_is_its_owner_s_once_redis_is_back(fake_llm_thread: FakeLLM,
                                                                              redis: RedisServer) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"redis.url": redis.url, "cache.enabled": False})
    with ProxyServer(settings) as server:
        redis.process.terminate()
        redis.process.wait(timeout=10)
        made = httpx.post(server.url + "/v1/responses", json={"model": "fake-model", "input": "made in an outage"},
                          timeout=30)
        assert made.status_code == 200, made.text
        response_id = made.json()["id"]
        back = RedisServer.start(redis.port, directory=redis.directory)
        try:
            def fetched() -> bool:
                return httpx.get(f"{server.url}/v1/responses/{response_id}", timeout=30).status_code == 200

            _until(fetched)  # once the store answers again, the owner kept in memory is recorded
            assert server.call(server.runtime.owners.owner(response_id)) is not None, "recorded in Redis"
        finally:
            back.stop()
