"""Three proxy replicas sharing one standalone Redis, driven by the official openai SDK over loopback HTTP:
a cross-replica hit, invalidation and version bumps through one replica's admin API holding on the others the
moment the call returns, and credits exact under concurrent load spread over the replicas."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai

from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.store import LedgerFilter, ledger_entries
from tests.scale.replicas import provision_user, shared_replicas, wait_stored
from tests.support.proxy_server import ProxyServer
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
CREDIT = 1_000_000


def sdk(server: ProxyServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def ask(client: openai.OpenAI, question: str) -> tuple[str, str | None, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": question}])
    return raw.headers["X-Cache-Status"], raw.headers.get("X-Cache-Key"), raw.parse()


def test_an_answer_cached_by_one_replica_is_a_hit_on_every_other(fake_llm_thread: FakeLLM, redis_url: str) -> None:
    with shared_replicas(3, fake_llm_thread.url, redis_url) as servers:
        clients = [sdk(s) for s in servers]
        questions = [f"question {n}" for n in range(9)]
        statuses = [ask(client, q)[0] for q, client in zip(questions, itertools.cycle(clients))]
        assert statuses == ["MISS"] * 9
        # the same questions, each asked of the two replicas that did not answer it
        for index, question in enumerate(questions):
            for offset in (1, 2):
                status, _, completion = ask(clients[(index + offset) % 3], question)
                assert status == "HIT", (question, offset)
                assert completion.choices[0].message.content
    assert fake_llm_thread.log.count(CHAT) == 9


def test_admin_invalidation_on_one_replica_is_a_miss_on_the_others_when_it_returns(
        fake_llm_thread: FakeLLM, redis_url: str) -> None:
    with shared_replicas(3, fake_llm_thread.url, redis_url, **{"cache.expose_key": True}) as servers:
        a, b, c = (sdk(s) for s in servers)
        _, key, _ = ask(a, "what changed?")
        assert key is not None
        wait_stored(servers[0], key)
        assert ask(b, "what changed?")[0] == "HIT"
        assert ask(c, "what changed?")[0] == "HIT"  # b and c now hold near copies
        reply = httpx.post(servers[0].admin_url + "/admin/invalidate", json={"keys": [key]}, timeout=10)
        assert reply.status_code == 200, reply.text
        assert ask(b, "what changed?")[0] == "MISS"
        wait_stored(servers[1], key)
        assert ask(c, "what changed?")[0] == "HIT", "b stored the fresh answer again, shared with c"
    assert fake_llm_thread.log.count(CHAT) == 2


def test_invalidation_by_document_reaches_every_near_cache(fake_llm_thread: FakeLLM, redis_url: str) -> None:
    with shared_replicas(3, fake_llm_thread.url, redis_url, **{"cache.expose_key": True}) as servers:
        clients = [sdk(s) for s in servers]
        _, key, _ = ask(clients[0], "about doc 7")
        assert key is not None
        wait_stored(servers[0], key)
        for client in clients[1:]:
            ask(client, "about doc 7")  # near copies on the other two
        outcome = servers[1].call(servers[1].l1.store.delete_tag("all"))
        assert outcome == 1
        assert ask(clients[0], "about doc 7")[0] == "MISS"
        wait_stored(servers[0], key)
        assert [ask(client, "about doc 7")[0] for client in clients[1:]] == ["HIT", "HIT"]


def test_version_bump_on_one_replica_holds_on_every_replica_when_it_returns(
        fake_llm_thread: FakeLLM, redis_url: str) -> None:
    with shared_replicas(3, fake_llm_thread.url, redis_url, **{"cache.expose_key": True}) as servers:
        clients = [sdk(s) for s in servers]
        _, key, _ = ask(clients[0], "versioned")
        assert key is not None
        wait_stored(servers[0], key)
        assert [ask(client, "versioned")[0] for client in clients] == ["HIT"] * 3
        reply = httpx.post(servers[2].admin_url + "/admin/versions/bump",
                           json={"tenant": "anonymous", "namespace": "default"}, timeout=10)
        assert reply.status_code == 200, reply.text
        assert reply.json()["version"] == "1"
        assert {s.runtime.versions.current("anonymous", "default") for s in servers} == {"1"}
        status, key, _ = ask(clients[1], "versioned")
        assert status == "MISS" and key is not None
        wait_stored(servers[1], key)
        assert [ask(client, "versioned")[0] for client in clients] == ["HIT"] * 3


def test_credits_are_exact_under_concurrent_load_across_replicas(fake_llm_thread: FakeLLM, redis_url: str) -> None:
    key = provision_user(redis_url, 50 * CREDIT)
    settings = {"auth.mode": "keys", "credits.enabled": True}
    with shared_replicas(3, fake_llm_thread.url, redis_url, **settings) as servers:
        clients = [sdk(s, key) for s in servers]
        # 60 requests, 20 distinct questions: misses and hits on every replica, 6 threads at once
        jobs = [(clients[n % 3], f"question {n % 20}") for n in range(60)]
        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(lambda job: ask(*job), jobs))
    assert len(results) == 60

    async def audit() -> tuple[int, int, int, int, int]:
        store = RedisCreditStore.from_url(redis_url)
        try:
            account = await store.balance("ann")
            entries = [e async for e in ledger_entries(store, LedgerFilter(user="ann"))]
            charges = [e for e in entries if e.kind == "charge"]
            return (account.available, account.held, sum(e.amount for e in entries), len(charges),
                    len({e.request_id for e in charges}))
        finally:
            await store.close()

    available, held, ledger_sum, charges, distinct = asyncio.run(audit())
    assert held == 0, "every reservation was settled"
    assert ledger_sum == available, "the ledger accounts for every credit"
    assert charges == distinct == 60, "one charge per answered request, none twice"
    assert available < 50 * CREDIT
