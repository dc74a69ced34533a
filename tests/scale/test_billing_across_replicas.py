"""Three proxy replicas on one Redis: a client-chosen request id never makes a call free, and an Idempotency-Key
holds across replicas (the official openai SDK as the client)."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.store import LedgerEntry, LedgerFilter, ledger_entries
from tests.scale.replicas import provision_user, shared_replicas
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
CREDIT = 1_000_000
BILLED = {"auth.mode": "keys", "credits.enabled": True}


def charges(redis_url: str) -> list[LedgerEntry]:
    async def read() -> list[LedgerEntry]:
        store = RedisCreditStore.from_url(redis_url)
        try:
            return [e async for e in ledger_entries(store, LedgerFilter(user="ann", kind="charge"))]
        finally:
            await store.close()

    return asyncio.run(read())


def test_150_calls_under_one_request_id_across_three_replicas_are_each_charged(
        fake_llm_thread: FakeLLM, redis_url: str) -> None:
    key = provision_user(redis_url, 100 * CREDIT)
    fake_llm_thread.latency_s = 0.05  # calls overlap: six in flight at once, on all three replicas
    with shared_replicas(3, fake_llm_thread.url, redis_url, **BILLED) as servers:
        clients = [openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0,
                                 default_headers={"X-Request-ID": "one-id-for-everything"}) for s in servers]

        def ask(job: tuple[openai.OpenAI, int]) -> httpx.Headers:
            client, n = job
            raw = client.chat.completions.with_raw_response.create(
                model="fake-model", max_tokens=16, messages=[{"role": "user", "content": f"question {n}"}])
            return raw.headers

        with ThreadPoolExecutor(max_workers=6) as pool:
            answered = list(pool.map(ask, zip(itertools.cycle(clients), range(150), strict=False)))
    ledger = charges(redis_url)
    upstream_calls = fake_llm_thread.log.count(CHAT)
    assert upstream_calls == 150
    assert len(ledger) == upstream_calls, "every upstream call is charged"
    assert sorted(e.request_id for e in ledger) == sorted(h["X-Credits-Request-ID"] for h in answered)
    assert {h["X-Request-ID"] for h in answered} == {"one-id-for-everything"}, "the id still travels for tracing"


def test_an_idempotency_key_is_answered_once_whichever_replica_a_repeat_reaches(
        fake_llm_thread: FakeLLM, redis_url: str) -> None:
    key = provision_user(redis_url, 100 * CREDIT)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "book the flight"}]}
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "booking-42"}
    with shared_replicas(3, fake_llm_thread.url, redis_url, **BILLED) as servers:
        replies = [httpx.post(s.url + CHAT, json=body, headers=headers, timeout=30) for s in servers]
        other = httpx.post(servers[2].url + CHAT, json={**body, "max_tokens": 5}, headers=headers, timeout=30)
    assert [r.status_code for r in replies] == [200, 200, 200]
    assert [r.headers.get("Idempotent-Replayed") for r in replies] == [None, "true", "true"]
    assert {r.json()["id"] for r in replies} == {replies[0].json()["id"]}
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert fake_llm_thread.log.count(CHAT) == 1
    assert len(charges(redis_url)) == 1
