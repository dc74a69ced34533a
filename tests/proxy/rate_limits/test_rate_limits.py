"""Rate limits, budgets and key lifetimes, black-box through HTTP: set through the admin API, enforced on the data
plane, shared by two replicas on one real redis-server, answered as OpenAI answers (429, ``Retry-After``,
``x-ratelimit-*``) and read by the official openai SDK."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.processes import RedisServer
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"


def _body(question: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": question}], **extra}


def _chat(url: str, key: str, **extra: Any) -> httpx.Response:
    return httpx.post(url + CHAT, json=_body(**extra), headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer.start()
    yield server
    server.stop()


def _settings(llm_url: str, **overrides: Any) -> Any:
    return proxy_settings(llm_url, **{"auth.mode": "keys", "cache.enabled": False, "auth.key_sync_s": 0.2,
                                      **overrides})


def test_requests_per_minute_are_shared_by_two_replicas_on_one_redis(fake_llm_thread: FakeLLM,
                                                                      redis_server: RedisServer) -> None:
    overrides = {"redis.url": redis_server.url}
    a = ProxyServer(_settings(fake_llm_thread.url, **overrides), admin=True)
    b = ProxyServer(_settings(fake_llm_thread.url, **overrides))
    with a, b, httpx.Client(base_url=a.admin_url, timeout=30) as admin:
        limited = admin.post("/admin/keys", json={"user": "ann", "tenant": "acme", "rpm_limit": 3})
        assert limited.status_code == 201, limited.text
        assert limited.json()["limits"]["rpm_limit"] == 3
        other = admin.post("/admin/keys", json={"user": "bob", "tenant": "acme"}).json()["key"]
        key = limited.json()["key"]
        answers = [_chat(url, key, question=f"q{n}") for n, url in enumerate([a.url, b.url, a.url])]
        assert [r.status_code for r in answers] == [200, 200, 200]
        assert [r.headers["x-ratelimit-limit-requests"] for r in answers] == ["3"] * 3
        assert [r.headers["x-ratelimit-remaining-requests"] for r in answers] == ["2", "1", "0"]
        reset = answers[-1].headers["x-ratelimit-reset-requests"]  # 3 requests drain in 60 s: about a minute
        assert reset.endswith("s") and reset.startswith(("59", "1m0s")), reset
        assert "x-ratelimit-limit-tokens" not in answers[-1].headers, "no token limit set"

        refused = _chat(b.url, key, question="q3")
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
        assert "Limit 3" in error["message"]
        wait = float(refused.headers["retry-after-ms"]) / 1000
        assert 15 <= wait <= 20.5, wait  # one request drains in 60/3 = 20 s
        assert refused.headers["Retry-After"] == str(math.ceil(wait))
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert fake_llm_thread.log.count(CHAT) == 3, "a refused request never reaches the upstream"

        assert _chat(a.url, other).status_code == 200, "another user's allowance is their own"
        assert "x-ratelimit-limit-requests" not in _chat(a.url, other).headers


def test_user_and_tenant_limits_apply_to_each_of_their_keys(fake_llm_thread: FakeLLM) -> None:
    with ProxyServer(_settings(fake_llm_thread.url), admin=True) as server, \
            httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        first, second = (admin.post("/admin/keys", json={"user": "ann", "tenant": "acme"}).json()["key"]
                         for _ in range(2))
        bob = admin.post("/admin/keys", json={"user": "bob", "tenant": "acme"}).json()["key"]
        put = admin.put("/admin/users/ann", json={"rpm_limit": 2})
        assert put.status_code == 200 and put.json()["limits"]["rpm_limit"] == 2, put.text
        assert admin.patch("/admin/tenants/acme", json={"rpm_limit": 3}).status_code == 200
        time.sleep(0.5)  # the change feed
        assert [_chat(server.url, key).status_code for key in (first, second)] == [200, 200]
        assert _chat(server.url, first).status_code == 429, "the user's two keys share her limit"
        assert _chat(server.url, bob).status_code == 200
        refused = _chat(server.url, bob)
        assert refused.status_code == 429, "the tenant's limit covers every user in it"
        assert "the tenant" in refused.json()["error"]["message"]
        shown = admin.get("/admin/users/ann").json()
        assert shown["usage"]["requests"] >= 1.9 and shown["limits"] == {
            "rpm_limit": 2, "tpm_limit": None, "max_budget": None, "budget_duration": None}
        removed = admin.patch("/admin/users/ann", json={"rpm_limit": None}).json()
        assert removed["limits"]["rpm_limit"] is None and removed["usage"] is None


def test_tokens_per_minute_count_the_estimate_and_settle_with_the_usage(fake_llm_thread: FakeLLM) -> None:
    settings = _settings(fake_llm_thread.url, **{"credits.enabled": True})
    with ProxyServer(settings, admin=True) as server, httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        key = admin.post("/admin/keys", json={"user": "ann", "tpm_limit": 1000}).json()["key"]
        assert admin.post("/admin/credits/ann", json={"amount": 10}).status_code == 200
        first = _chat(server.url, key, max_tokens=600)
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit-tokens"] == "1000"
        assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 400  # 600 asked, the prompt too
        too_large = _chat(server.url, key, max_tokens=2000)
        assert too_large.status_code == 429 and too_large.headers["x-should-retry"] == "false"
        assert too_large.json()["error"]["type"] == "tokens" and "Request too large" in too_large.json()["error"][
            "message"]
        assert "Retry-After" not in too_large.headers

        def settled() -> float:
            return float(admin.get("/admin/limits").json()["keys"][0]["usage"]["tokens"])

        deadline = time.monotonic() + 10
        while settled() > 100 and time.monotonic() < deadline:  # settled with the usage: a few tokens, not 600
            time.sleep(0.1)
        assert settled() < 100
        second = _chat(server.url, key, max_tokens=600)
        assert second.status_code == 200, "room again once the first request settled at what it used"


def test_a_budget_is_refused_after_its_window_s_spend_and_restored_when_it_resets(fake_llm_thread: FakeLLM,
                                                                                    redis_server: RedisServer) -> None:
    settings = _settings(fake_llm_thread.url, **{"credits.enabled": True, "redis.url": redis_server.url})
    with ProxyServer(settings, admin=True) as server, httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        created = admin.post("/admin/keys", json={"user": "ann", "max_budget": "0.00001", "budget_duration": "4s"})
        assert created.status_code == 201, created.text
        key, key_id = created.json()["key"], created.json()["key_id"]
        assert admin.post("/admin/credits/ann", json={"amount": 10}).status_code == 200
        refused = None
        for _ in range(3):  # a round that a busy machine stretched past its window is run again in the next one
            time.sleep(4 - time.time() % 4 + 0.05)  # at the start of a window
            window = time.time() // 4
            first = _chat(server.url, key)
            assert first.status_code == 200, first.text
            assert float(first.headers["X-Credits-Charged"]) >= 0.00001  # the fake upstream's usage costs this much

            def spent() -> str | None:
                usage = admin.get(f"/admin/keys/{key_id}").json()["usage"]
                return usage["budget_spent"] if usage else None

            deadline = time.monotonic() + 2
            while spent() == "0" and time.monotonic() < deadline:
                time.sleep(0.05)
            refused = _chat(server.url, key)
            if time.time() // 4 == window:
                break
        assert refused is not None and refused.status_code == 429, refused.text if refused else None
        assert refused.json()["error"]["code"] == "insufficient_quota"
        assert 0 < float(refused.headers["retry-after-ms"]) <= 4000
        resets_at = admin.get(f"/admin/keys/{key_id}").json()["usage"]["budget_resets_at"]
        time.sleep(max(0.0, resets_at - time.time()) + 0.05)
        assert _chat(server.url, key).status_code == 200, "a new window, a new budget"


def test_a_budget_needs_credits_and_a_period_needs_a_budget(fake_llm_thread: FakeLLM) -> None:
    with ProxyServer(_settings(fake_llm_thread.url), admin=True) as server, \
            httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        no_credits = admin.post("/admin/keys", json={"user": "ann", "max_budget": 1})
        assert no_credits.status_code == 400 and "credits" in no_credits.json()["error"]["message"]
        assert admin.put("/admin/users/ann", json={"budget_duration": "1d"}).status_code == 400
        for bad in ({"rpm_limit": 0}, {"rpm_limit": "5"}, {"rpm_limit": 1.5}, {"budget_duration": "1y"},
                    {"tpm_limit": 10**13}, {"limits": {}}, {"rpm_limit": True}):
            answer = admin.patch("/admin/tenants/acme", json=bad)
            assert answer.status_code == 400, (bad, answer.text)
        assert admin.get("/admin/tenants/" + "x" * 201).status_code == 400
        assert admin.patch("/admin/keys/key_nope", json={"rpm_limit": 1}).status_code == 404


def test_an_expired_key_is_refused_like_an_unknown_one(fake_llm_thread: FakeLLM) -> None:
    with ProxyServer(_settings(fake_llm_thread.url), admin=True) as server, \
            httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        short = admin.post("/admin/keys", json={"user": "ann", "duration": "2s"}).json()
        assert short["expires_at"] == pytest.approx(time.time() + 2, abs=1)
        kept = admin.post("/admin/keys", json={"user": "bob", "expires_at": time.time() + 3600}).json()
        assert _chat(server.url, short["key"]).status_code == 200
        time.sleep(max(0.0, short["expires_at"] - time.time()) + 0.05)
        expired = _chat(server.url, short["key"])
        assert expired.status_code == 401, expired.text
        assert expired.json()["error"] == {"message": "Incorrect API key provided.", "type": "authentication_error",
                                           "param": None, "code": "invalid_api_key"}
        assert _chat(server.url, kept["key"]).status_code == 200
        listed = {key["key_id"]: key for key in admin.get("/admin/keys").json()["keys"]}
        assert listed[short["key_id"]]["expired"] and not listed[kept["key_id"]]["expired"]

        ended = admin.patch(f"/admin/keys/{kept['key_id']}", json={"expires_at": time.time() - 1})
        assert ended.status_code == 200 and ended.json()["expired"]
        time.sleep(0.5)  # the change feed reaches the remembered key
        assert _chat(server.url, kept["key"]).status_code == 401
        assert admin.patch(f"/admin/keys/{kept['key_id']}", json={"expires_at": None}).status_code == 200
        time.sleep(0.5)
        assert _chat(server.url, kept["key"]).status_code == 200, "an expiry taken back"
        assert admin.post("/admin/keys", json={"user": "cy", "expires_at": 1.0}).status_code == 400
        assert admin.post("/admin/keys", json={"user": "cy", "expires_at": time.time() + 60,
                                               "duration": "1d"}).status_code == 400


def test_the_openai_sdk_sees_a_rate_limit_error_and_its_retry_waits_for_retry_after(fake_llm_thread: FakeLLM) -> None:
    with ProxyServer(_settings(fake_llm_thread.url), admin=True) as server, \
            httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        key = admin.post("/admin/keys", json={"user": "ann", "rpm_limit": 12}).json()["key"]
        once = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        for n in range(12):
            once.chat.completions.create(**_body(f"q{n}"))
        with pytest.raises(openai.RateLimitError) as caught:
            once.chat.completions.create(**_body("one more"))
        assert caught.value.status_code == 429 and caught.value.code == "rate_limit_exceeded"
        wait = float(caught.value.response.headers["retry-after-ms"]) / 1000

        retrying = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=2)
        started = time.monotonic()
        answer = retrying.chat.completions.with_raw_response.create(**_body("again"))
        waited = time.monotonic() - started
        assert answer.http_response.status_code == 200
        assert answer.retries_taken >= 1
        assert waited >= wait - 1.0, (waited, wait)  # it slept Retry-After, not its own 0.5 s backoff
