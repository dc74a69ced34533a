"""Keys, admin writes and stored-response owners through an outage of the shared Redis: stopped, restarted empty,
flushed, and restored, mid-test, against a real redis-server.

Before: a key revoked before the outage worked for the whole outage once its 30 s cache entry aged (the replica
trusted every key it had seen); during a wipe ``POST /admin/keys`` answered 201 for a key the restore then lost and
a revocation answered 404; and a stored response made during a wipe was 404 for its owner for good once the data
was restored (its owner had been recorded only in the empty Redis).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support.processes import VOLATILE, RedisServer
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer.start(None, "--appendfsync", "always")
    yield server
    server.stop()


def _until(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("not within the time allowed")


def _chat(url: str, key: str) -> httpx.Response:
    return httpx.post(url + CHAT, json=BODY, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _ready(url: str) -> int:
    return httpx.get(url + "/readyz", timeout=10).status_code


def test_a_key_revoked_before_a_redis_outage_stays_refused_through_it(fake_llm_thread: FakeLLM,
                                                                      redis_server: RedisServer) -> None:
    """Two replicas on one Redis: a key revoked on one is refused by the other, which had it cached, through an outage
    that begins after the revocation and outlasts the key cache; a key known good keeps working."""
    overrides: dict[str, Any] = {"redis.url": redis_server.url, "auth.mode": "keys", "cache.enabled": False,
                                 "auth.key_cache_ttl_s": 2.0, "auth.key_sync_s": 0.2}
    a = ProxyServer(proxy_settings(fake_llm_thread.url, **overrides), admin=True)
    b = ProxyServer(proxy_settings(fake_llm_thread.url, **overrides))
    with a, b, httpx.Client(base_url=a.admin_url, timeout=30) as admin:
        revoked = admin.post("/admin/keys", json={"user": "ann", "tenant": "acme"}).json()
        kept = admin.post("/admin/keys", json={"user": "bob", "tenant": "acme"}).json()["key"]
        assert _chat(b.url, revoked["key"]).status_code == 200  # B remembers both keys now
        assert _chat(b.url, kept).status_code == 200
        cached_at = time.monotonic()

        assert admin.delete(f"/admin/keys/{revoked['key_id']}").status_code == 200
        _until(lambda: _chat(b.url, revoked["key"]).status_code == 401, timeout_s=1.5)  # within key_sync_s
        redis_server.process.terminate()
        redis_server.process.wait(timeout=10)
        time.sleep(max(0.0, cached_at + 2.5 - time.monotonic()))  # past the key cache's age: no lookup can answer

        refused = _chat(b.url, revoked["key"])
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert _chat(b.url, kept).status_code == 200, "a key known good rides out the outage"


def test_admin_key_writes_that_a_wiped_redis_cannot_keep_answer_503(fake_llm_thread: FakeLLM,
                                                                   redis_server: RedisServer) -> None:
    """Redis flushed mid-run, before the periodic check could notice (``redis.wipe_check_s`` 60): issuing a key and
    revoking one answer 503 with ``Retry-After`` (not 201 for a key the restore would lose, not 404), and an
    unknown key is a 503, not a 401."""
    settings = proxy_settings(fake_llm_thread.url, **{"redis.url": redis_server.url, "auth.mode": "keys",
                                                      "cache.enabled": False, "redis.wipe_check_s": 60.0})
    with ProxyServer(settings, admin=True) as server, httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        ann = admin.post("/admin/keys", json={"user": "ann", "tenant": "acme"}).json()
        client = redis.Redis(port=redis_server.port)
        client.flushall()
        client.close()

        created = admin.post("/admin/keys", json={"user": "bob", "tenant": "acme"})
        assert created.status_code == 503, created.text
        assert "Retry-After" in created.headers and "key" not in created.json()
        revoked = admin.delete(f"/admin/keys/{ann['key_id']}")
        assert revoked.status_code == 503, revoked.text
        assert "Retry-After" in revoked.headers
        assert admin.get("/admin/keys").status_code == 503, "an empty list is not the truth either"
        unknown = _chat(server.url, "rpk_" + "x" * 43)
        assert unknown.status_code == 503, unknown.text
        assert _ready(server.url) == 503, "the wipe is known now"


def test_a_top_up_a_wiped_redis_cannot_keep_answers_503(fake_llm_thread: FakeLLM, redis_server: RedisServer) -> None:
    """The same for credits: a top-up into a flushed Redis would vanish at the restore (it answered 200)."""
    settings = proxy_settings(fake_llm_thread.url, **{"redis.url": redis_server.url, "auth.mode": "keys",
                                                      "credits.enabled": True, "cache.enabled": False,
                                                      "redis.wipe_check_s": 60.0})
    with ProxyServer(settings, admin=True) as server, httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        assert admin.post("/admin/credits/ann", json={"amount": 5}).status_code == 200
        client = redis.Redis(port=redis_server.port)
        client.flushall()
        client.close()
        topped = admin.post("/admin/credits/ann", json={"amount": 5})
        assert topped.status_code == 503, topped.text
        assert "Retry-After" in topped.headers
        assert admin.get("/admin/ledger").status_code == 503, "an empty ledger is not the truth either"


def test_a_response_made_during_a_wipe_is_its_owner_s_after_the_restore(fake_llm_thread: FakeLLM,
                                                                       redis_server: RedisServer) -> None:
    """Redis restarted empty (its data kept aside), a stored response made meanwhile, the data restored: its owner
    fetches it (200), and another tenant still cannot (404)."""
    overrides: dict[str, Any] = {"redis.url": redis_server.url, "redis.wipe_check_s": 0.2, "auth.mode": "keys",
                                 "credits.enabled": True, "cache.enabled": False}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides), admin=True) as server, \
            httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        keys = {user: admin.post("/admin/keys", json={"user": user, "tenant": user}).json()["key"]
                for user in ("ann", "eve")}
        for user in keys:
            assert admin.post(f"/admin/credits/{user}", json={"amount": 100, "tenant": user}).status_code == 200
        owner, other = ({"Authorization": f"Bearer {keys[user]}"} for user in ("ann", "eve"))
        for headers in (owner, other):  # each key verified, each balance known: both ride out the wipe
            assert httpx.post(server.url + CHAT, json=BODY, headers=headers, timeout=30).status_code == 200

        redis_server.process.terminate()
        redis_server.process.wait(timeout=10)
        empty = RedisServer.start(redis_server.port, *VOLATILE)  # same port, no data
        try:
            _until(lambda: _ready(server.url) == 503)
            made = httpx.post(server.url + "/v1/responses", json={"model": "fake-model", "input": "in a wipe"},
                              headers=owner, timeout=30)
            assert made.status_code == 200, made.text
            response_id = made.json()["id"]
        finally:
            empty.stop()
        redis_server.process = RedisServer.start(redis_server.port, directory=redis_server.directory).process
        _until(lambda: _ready(server.url) == 200)

        fetched = httpx.get(f"{server.url}/v1/responses/{response_id}", headers=owner, timeout=30)
        assert fetched.status_code == 200, fetched.text
        assert server.call(server.runtime.owners.owner(response_id)) is not None, "recorded in the restored Redis"
        assert httpx.get(f"{server.url}/v1/responses/{response_id}", headers=other,
                         timeout=30).status_code == 404
