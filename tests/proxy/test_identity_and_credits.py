"""API keys, tenant isolation and credits through the real data plane and the official SDK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.core.outcome import MICRO
from proxy.credits.store import ledger_entries
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"


def _body(question: str = "Which tier answered?", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": question}], "max_tokens": 50, **extra}


@pytest.fixture
def billed(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, **{
        "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path),
        "credits.sqlite_synchronous": "NORMAL",
        "credits.models": {"fake-model": {"prompt_per_1k": 1, "completion_per_1k": 2, "context_tokens": 4096}},
    })
    with ProxyServer(settings) as server:
        yield server


def _key(server: ProxyServer, user: str, tenant: str, credits: float = 0) -> str:
    created = server.call(server.runtime.credits.keys.create(user, tenant))  # type: ignore[union-attr]
    if credits:
        server.call(server.runtime.credits.store.top_up(user, int(credits * MICRO), tenant=tenant))  # type: ignore[union-attr]
    return str(created.plaintext)


def _post(server: ProxyServer, key: str | None, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + CHAT, json=body, headers=headers, timeout=30)


def test_keys_required(billed: ProxyServer) -> None:
    for key in (None, "rpk_not-a-real-key"):
        response = _post(billed, key, _body())
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(**_body())


def test_no_cross_tenant_hits(fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    alice = _key(billed, "alice", "acme", credits=10)
    bob = _key(billed, "bob", "globex", credits=10)
    carol = _key(billed, "carol", "acme", credits=10)
    assert _post(billed, alice, _body()).headers["X-Cache-Status"] == "MISS"
    assert _post(billed, bob, _body()).headers["X-Cache-Status"] == "MISS", "another tenant never hits"
    assert _post(billed, carol, _body()).headers["X-Cache-Status"] == "HIT", "same tenant shares"
    assert fake_llm_thread.log.count(CHAT) == 2


async def test_no_cross_tenant_coalescing(fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    fake_llm_thread.latency_s = 0.4
    keys = [_key(billed, f"user{i}", f"tenant{i % 2}", credits=10) for i in range(2)]
    async with httpx.AsyncClient(timeout=30) as client:
        responses = await asyncio.gather(*(
            client.post(billed.url + CHAT, json=_body("concurrent"), headers={"Authorization": f"Bearer {k}"})
            for k in keys * 10
        ))
    assert all(r.status_code == 200 for r in responses)
    assert fake_llm_thread.log.count(CHAT) == 2, "one upstream call per tenant, never one shared across tenants"


def test_charges_hits_at_a_discount(billed: ProxyServer) -> None:
    key = _key(billed, "dave", "acme", credits=5)
    store = billed.runtime.credits.store
    assert store is not None
    miss = _post(billed, key, _body())
    hit = _post(billed, key, _body())
    charged_miss = float(miss.headers["X-Credits-Charged"])
    charged_hit = float(hit.headers["X-Credits-Charged"])
    assert charged_miss > 0
    assert charged_hit == pytest.approx(charged_miss * 0.1, rel=0.05)
    account = billed.call(store.balance("dave"))
    assert account.available == pytest.approx(5 * MICRO - (charged_miss + charged_hit) * MICRO, abs=2)
    assert float(hit.headers["X-Credits-Remaining"]) == pytest.approx(account.available / MICRO, abs=1e-5)


def test_insufficient_credit_is_openais_429_insufficient_quota_and_not_retried(fake_llm_thread: FakeLLM,
                                                                              billed: ProxyServer) -> None:
    """OpenAI answers an exhausted quota with 429 ``insufficient_quota``; the SDK raises ``RateLimitError`` for it and
    would retry it twice by default: ``x-should-retry: false`` (and no ``Retry-After``) stops that."""
    key = _key(billed, "erin", "acme", credits=0.00001)
    response = _post(billed, key, _body())
    assert response.status_code == 429
    assert response.headers["x-should-retry"] == "false" and "retry-after" not in response.headers
    error = response.json()["error"]
    assert error["type"] == error["code"] == "insufficient_quota" and error["param"] is None
    assert "exceeded your current quota" in error["message"] and "balance" in error["message"].lower()
    sent: list[httpx.Request] = []
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=key,  # the SDK's default retries
                           http_client=httpx.Client(event_hooks={"request": [sent.append]}))
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(**_body())
    assert raised.value.status_code == 429 and raised.value.code == "insufficient_quota"
    assert len(sent) == 1, "not retried"
    assert fake_llm_thread.log.count(CHAT) == 0


def test_a_cached_answer_is_served_on_a_balance_too_low_for_a_miss(fake_llm_thread: FakeLLM,
                                                                   billed: ProxyServer) -> None:
    """The caches are looked up before a miss's worst case is reserved: a repeat costs what it costs."""
    rich = _key(billed, "fay", "acme", credits=100)
    question = _body("What is cached already?", max_tokens=None)  # no max_tokens: the worst case is the context's
    miss = _post(billed, rich, question)
    hit_cost = float(_post(billed, rich, question).headers["X-Credits-Charged"])
    worst = billed.runtime.credits.prices.worst_case(question) / MICRO
    assert 0 < hit_cost * 20 < worst, (hit_cost, worst)
    low = _key(billed, "gus", "acme", credits=hit_cost * 20)
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=low, max_retries=0)
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(**question, stream=stream)
        assert raw.headers["X-Cache-Status"] == "HIT"
        answer = raw.parse()
        text = answer.choices[0].message.content if not stream else \
            "".join(chunk.choices[0].delta.content or "" for chunk in answer if chunk.choices)
        assert text == miss.json()["choices"][0]["message"]["content"]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**_body("Not cached yet?", max_tokens=None))
    assert fake_llm_thread.log.count(CHAT) == 1, "the refused miss never went upstream"
    spent = _charges_of(billed, "gus")
    assert spent == [pytest.approx(hit_cost * MICRO, abs=1)] * 2, "each hit charged its own price, nothing held"
    assert billed.call(billed.runtime.credits.store.balance("gus")).held == 0  # type: ignore[union-attr]
    broke = _key(billed, "hal", "acme", credits=hit_cost / 2)
    refused = _post(billed, broke, question)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota", \
        "a hit is refused when the balance cannot cover the hit itself"
    assert _charges_of(billed, "hal") == []


def _charges_of(server: ProxyServer, user: str) -> list[int]:
    store = server.runtime.credits.store
    assert store is not None

    async def entries() -> list[int]:
        return [e.cost async for e in ledger_entries(store) if e.user == user and e.kind == "charge"]

    return server.call(entries())


def test_upstream_error_refunds_everything(fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    key = _key(billed, "frank", "acme", credits=1)
    store = billed.runtime.credits.store
    assert store is not None
    fake_llm_thread.faults.fail_next(500)
    assert _post(billed, key, _body("fails")).status_code == 500
    account = billed.call(store.balance("frank"))
    assert account.available == MICRO and account.held == 0


def test_streaming_settles_from_usage_the_client_did_not_ask_for(fake_llm_thread: FakeLLM,
                                                                 billed: ProxyServer) -> None:
    key = _key(billed, "gina", "acme", credits=1)
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=key, max_retries=0)
    chunks = list(client.chat.completions.create(stream=True, **_body("stream and bill")))
    assert all(chunk.usage is None for chunk in chunks), "the usage chunk the proxy asked for is stripped"
    assert fake_llm_thread.log.for_path("/v1/chat/completions")[-1].json()["stream_options"] == {"include_usage": True}
    store = billed.runtime.credits.store
    assert store is not None

    async def entries() -> list[Any]:
        return [e async for e in ledger_entries(store) if e.user == "gina" and e.kind == "charge"]

    deadline = time.monotonic() + 30  # a failure bound only: settling follows the stream's end, the loop its event
    while not (charged := billed.call(entries())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(charged) == 1 and charged[0].completion_tokens > 0 and charged[0].usage_source != "reserved"


def test_a_stream_the_sdk_closes_right_after_done_is_still_settled(fake_llm_thread: FakeLLM,
                                                                   billed: ProxyServer) -> None:
    """The SDK stops reading at ``[DONE]`` and closes; the upstream's end of the response comes later."""
    fake_llm_thread.end_latency_s = 1.0
    key = _key(billed, "ivan", "acme", credits=1)
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=key, max_retries=0)
    chunks = list(client.chat.completions.create(stream=True, **_body("stream, then hang up")))
    assert chunks and chunks[-1].choices[0].finish_reason == "stop"
    store = billed.runtime.credits.store
    assert store is not None

    async def entries() -> list[Any]:
        return [e async for e in ledger_entries(store) if e.user == "ivan" and e.kind == "charge"]

    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while not (charged := billed.call(entries())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(charged) == 1 and charged[0].usage_source != "reserved", "the answer delivered is billed"


async def test_concurrent_requests_never_overspend(fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    key = _key(billed, "hank", "acme", credits=0)
    store = billed.runtime.credits.store
    assert store is not None
    estimate = billed.runtime.credits.prices.worst_case(_body("q 0"))
    billed.call(store.top_up("hank", estimate * 20, tenant="acme"))
    before = billed.call(store.balance("hank")).balance
    async with httpx.AsyncClient(timeout=60) as client:
        responses = await asyncio.gather(*(
            client.post(billed.url + CHAT, json=_body(f"q {i}"), headers={"Authorization": f"Bearer {key}"})
            for i in range(60)
        ))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) >= 10, "the balance covers at least twenty worst cases"
    after = billed.call(store.balance("hank"))
    assert after.available >= 0 and after.held == 0

    async def spent() -> int:
        return sum(e.cost for e in [e async for e in ledger_entries(store)] if e.user == "hank" and e.kind == "charge")

    assert billed.call(spent()) == before - after.balance
