"""Audit of bounded resources: every cap exists and holds when driven far past it.

Each test pushes one structure well beyond its cap and asserts the structure (and its side indexes) stay
within it. Caps audited: L1 entries and bytes (through the data plane), the coalescing table (``max_flights``) and
its recently landed keys (``max_landed``),
the cold tier's write-behind queue, the document registry and its anchor indexes, the retrieval cache's reverse
indexes (per partition, by collection, by point id), the L1 tag index, the API-key cache, request statistics,
the stale store, and the request body size (also for chunked bodies with no Content-Length).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from normalizer.documents import DocumentRegistry
from normalizer.search_request import SearchItem
from proxy.answers.coalesce import Coalesce, Flights
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import CHAT as CHAT_API
from proxy.observability.stats import COST_MEMORY, RequestStats
from proxy.server.request import Request
from tests.support.proxy_server import ProxyServer, proxy_settings
from tiers.demotion import Demoter
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.retrieval.index import ProximityIndex
from tiers.retrieval.writes import WriteEffect, WriteScope
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"


@pytest.fixture
def small_l1(fake_llm_thread: FakeLLM) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l1.max_entries": 5, "cache.l1.max_bytes": 4000,
                                                      "cache.l3.enabled": False})
    with ProxyServer(settings) as server:
        yield server


def test_l1_entries_and_bytes_hold_through_the_data_plane(small_l1: ProxyServer) -> None:
    with httpx.Client(base_url=small_l1.url, timeout=10) as client:
        for i in range(40):
            body = {"model": "fake-model", "messages": [{"role": "user", "content": f"question {i} " * (i % 7 + 1)}]}
            assert client.post(CHAT, json=body).status_code == 200
            stats = small_l1.call(small_l1.l1.stats())
            assert stats.entries <= 5 and stats.bytes <= 4000
    assert small_l1.l1.counters.stores >= 5


def test_chunked_body_past_the_limit_is_413_without_reaching_upstream(fake_llm_thread: FakeLLM) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"server.max_body_bytes": 4096})
    with ProxyServer(settings) as server:
        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must hold while reading
            yield b'{"model": "fake-model", "messages": [{"role": "user", "content": "'
            for _ in range(200):
                yield b"x" * 1024
            yield b'"}]}'

        response = httpx.post(server.url + CHAT, content=chunks(), headers={"Content-Type": "application/json"})
        assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert fake_llm_thread.log.count(CHAT) == 0


def _ctx(key: str) -> RequestContext:
    ctx = RequestContext(request=Request("POST", CHAT), route="chat", request_id=key)
    ctx.cache_key = key
    return ctx


async def test_coalescing_table_is_capped_by_max_flights() -> None:
    stage = Coalesce(endpoint=CHAT_API, wait_s=5.0, flights=Flights(max_flights=3))
    release, all_in = asyncio.Event(), asyncio.Event()
    sizes: list[int] = []

    async def upstream(ctx: RequestContext) -> Reply:
        sizes.append(len(stage.flights))
        if len(sizes) == 50:
            all_in.set()
        await release.wait()
        return Reply(status=200, body=b'{"id": "x", "choices": []}')

    calls = [asyncio.create_task(stage(_ctx(f"k{i}"), upstream)) for i in range(50)]
    await asyncio.wait_for(all_in.wait(), 10)
    assert max(sizes) <= 3 and len(stage.flights) == 3, "beyond the cap requests go upstream uncoalesced"
    release.set()
    replies = await asyncio.gather(*calls)
    for reply in replies:
        await reply.finish(True, reply.body or b"")
    assert not stage.flights, "every flight lands"


async def test_recently_landed_keys_are_capped() -> None:
    stage = Coalesce(endpoint=CHAT_API, wait_s=5.0, flights=Flights(max_landed=16))

    async def upstream(ctx: RequestContext) -> Reply:
        return Reply(status=200, body=b'{"id": "x", "choices": []}')

    for i in range(200):
        ctx = _ctx(f"k{i}")
        ctx.cache_policy = None
        reply = await stage(ctx, upstream)
        await reply.finish(True, reply.body or b"")
    assert list(stage.flights.landed) == [f"k{i}" for i in range(184, 200)], "the newest 16, oldest first"


async def test_write_behind_queue_drops_instead_of_growing() -> None:
    gate = asyncio.Event()

    class StalledDisk:
        async def put(self, key: str, value: bytes, *, ttl: float | None = None, tags: Any = (),
                      cost: float = 1.0) -> bool:
            await gate.wait()
            return True

    demoter = Demoter(StalledDisk(), max_queue=8, drain_timeout=1.0)
    demoter.start()
    for i in range(1000):
        demoter.offer(f"k{i}", b"v" * 100, frozenset(), 1.0, None)
        assert demoter.pending <= 8
    assert demoter.dropped >= 1000 - 9
    gate.set()
    await demoter.stop()


def test_document_registry_and_its_indexes_are_capped() -> None:
    registry = DocumentRegistry(capacity=50)
    for i in range(5000):
        registry.add(f"document number {i} about topic {i % 97} with words {i * 7}")
    assert len(registry) == 50
    assert len(registry._by_anchor) <= 50 and len(registry._first_words) <= 50
    assert sum(registry._anchor_lengths.values()) == 50


def _item(i: int, params: str = "p") -> SearchItem:
    vector = np.full(4, float(i % 13) + 1.0, dtype=np.float32)
    return SearchItem(params_hash=params, exact_key=f"{params}-{i}", vector_name="", vector=vector,
                      collections=frozenset({"docs"}), rank_sensitive=False, payload_sensitive=False)


def test_retrieval_reverse_indexes_are_capped() -> None:
    index = ProximityIndex(make_policy("lru", 64 * 1024), max_entries_per_partition=20, max_tracked_ids=10)
    for i in range(3000):
        index.admit("t", "docs", _item(i, params=f"p{i % 4}"), result_ids=range(i, i + 8), size=100,
                    seen_versions={})
    assert len(index) <= 4 * 20
    tracked = sum(len(keys) for keys in index._by_point.values())
    assert tracked <= len(index) * 10, "the point reverse index only holds live entries"
    assert sum(len(keys) for keys in index._by_collection.values()) == len(index)
    index.admit("t", "docs", _item(-1), result_ids=range(1000), size=100, seen_versions={})
    assert tracked + 1000 > sum(len(keys) for keys in index._by_point.values()), "past max_tracked_ids: untracked"


def test_retrieval_write_versions_are_capped() -> None:
    index = ProximityIndex(make_policy("lru", 64 * 1024))
    for i in range(20_000):
        index.invalidate(WriteEffect(WriteScope.COLLECTION, f"no-such-collection-{i}"))
    assert len(index._versions) <= 10_000


async def test_l1_tag_index_forgets_evicted_entries() -> None:
    store = MemoryStore(make_policy("lru", 10_000), max_entries=10)
    for i in range(2000):
        await store.put(f"k{i}", b"v" * 50, tags=["all", f"doc:{i}", f"tenant:{i % 3}"])
    assert (await store.stats()).entries <= 10
    assert len(await store.keys_with_tag("all")) <= 10
    assert sum([len(await store.keys_with_tag(f"doc:{i}")) for i in range(2000)]) <= 10
    assert len(store._tags) <= 10 + 3 + 1, "tags of evicted entries are dropped from the index"


def test_request_stats_memory_is_constant() -> None:
    stats = RequestStats()
    for i in range(COST_MEMORY + 20_000):
        stats.record(route="chat", cache_status="MISS", tier=None, key=f"k{i}", upstream_seconds=0.1,
                     hit_cost=None, label={"tenant": "t", "namespace": "n", "question": "q" * 200})
    sizes = {name: len(value) for name, value in vars(stats).items() if isinstance(value, dict | list)}
    assert all(size <= COST_MEMORY for size in sizes.values()), sizes
