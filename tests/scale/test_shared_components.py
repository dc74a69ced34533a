"""Shared-mode components against a real Redis: near cache + bus coherence, shared versions, the prefix board.

Several "replicas" here are several sets of components in one event loop, each with its own Redis connections —
what they share is only Redis, as separate processes would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from proxy.assembly.config import load_settings
from proxy.cache_tiers.shared_mode import SharedMode, SharedOptions, build_shared
from proxy.kv.hints import prefix_hashes as path_hashes
from proxy.kv.prefix_board import PrefixSummaryBoard
from tiers.entry import CachedResponse
from tiers.invalidation_bus import Pending, lease_valid
from tiers.memory import MemoryStore
from tiers.near_cache import NearCachedStore
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier


def test_pending_completes_when_the_expected_count_is_reached_in_any_order() -> None:
    early = Pending()
    early.ack("a")
    early.ack("b")
    assert not early.done.is_set(), "the count is unknown until PUBLISH answered"
    early.expect(2)
    assert early.done.is_set()
    late = Pending()
    late.expect(3)
    late.ack("a")
    late.ack("a")
    late.ack("b")
    assert not late.done.is_set(), "one replica acking twice counts once"
    late.ack("c")
    assert late.done.is_set()


def test_lease() -> None:
    assert lease_valid(True, 10.0, 12.9, 3.0)
    assert not lease_valid(True, 10.0, 13.0, 3.0)
    assert not lease_valid(False, 10.0, 10.1, 3.0)


async def _replicas(url: str, count: int, options: SharedOptions | None = None) -> list[SharedMode]:
    replicas = []
    for _ in range(count):
        shared = build_shared(load_settings(env={}, overrides={"redis.url": url}), options=options)
        assert shared is not None
        await shared.start()
        replicas.append(shared)
    return replicas


@pytest.fixture
async def three(redis_url: str) -> AsyncIterator[list[SharedMode]]:
    replicas = await _replicas(redis_url, 3)
    yield replicas
    for shared in replicas:
        await shared.stop()


def _entry(text: str) -> CachedResponse:
    return CachedResponse(body=f'{{"answer": "{text}"}}'.encode(), kind="chat", model="m")


def test_embedded_mode_has_no_shared_components() -> None:
    assert build_shared(load_settings(env={})) is None


async def test_an_entry_stored_by_one_replica_is_a_hit_on_the_others(three: list[SharedMode]) -> None:
    a, b, c = three
    assert await a.l1.put("k", _entry("x"), ttl=60, tags=["all", "doc:1"])
    for other in (b, c):
        got = await other.l1.get("k")
        assert got is not None and got.body == _entry("x").body
    assert b.near.shared_hits == 1
    await b.l1.get("k")
    assert b.near.near_hits == 1, "the second read is served from the near cache"


async def test_delete_on_one_replica_is_a_miss_everywhere_when_it_returns(three: list[SharedMode]) -> None:
    a, b, c = three
    await a.l1.put("k", _entry("x"), ttl=60, tags=["all"])
    for other in (b, c):
        await other.l1.get("k")
        assert other.near.near.get_nowait("k") is not None  # a near copy exists on every replica
    assert await a.l1.delete("k") is True
    delivery = a.near.last_delivery
    assert delivery is not None and delivery.complete and delivery.expected == 3 and delivery.acked == 3
    for replica in three:
        assert replica.near.near.get_nowait("k") is None
        assert await replica.l1.get("k") is None
    assert a.summary()["last_broadcast"]["acked"] == 3
    assert a.summary()["bus_trusted"] is True


async def test_tag_removal_and_clear_reach_every_near_cache(three: list[SharedMode]) -> None:
    a, b, _ = three
    for index in range(6):
        await a.l1.put(f"k{index}", _entry(str(index)), ttl=60, tags=["all", f"doc:{index % 2}"])
    for index in range(6):
        assert await b.l1.get(f"k{index}") is not None
    assert await a.l1.delete_tag("doc:0") == 3
    assert [await b.l1.get(f"k{index}") is not None for index in range(6)] == [False, True] * 3
    await a.l1.store.clear()
    assert all([await b.l1.get(f"k{index}") is None for index in range(6)])


async def test_near_copies_never_outlive_the_redis_entry(three: list[SharedMode]) -> None:
    a, b, _ = three
    await a.l1.put("short", _entry("s"), ttl=0.3, tags=["all"])
    assert await b.l1.get("short") is not None
    await asyncio.sleep(0.4)
    assert await b.l1.get("short") is None
    assert await a.l1.get("short") is None


async def test_version_bump_is_seen_by_every_replica_when_it_returns(three: list[SharedMode]) -> None:
    a, b, c = three
    assert [r.versions.current("t", "docs") for r in three] == ["0", "0", "0"]
    assert await a.versions.bump("t", "docs") == "1"
    assert [r.versions.current("t", "docs") for r in three] == ["1", "1", "1"]
    assert await c.versions.bump("t", "docs") == "2"
    assert b.versions.current("t", "docs") == "2"
    assert b.versions.current("t", "other") == "0"


async def test_a_replica_started_later_loads_the_versions(redis_url: str, three: list[SharedMode]) -> None:
    await three[0].versions.bump("acme", "ns:with:colons")
    (late,) = await _replicas(redis_url, 1)
    try:
        assert late.versions.current("acme", "ns:with:colons") == "1"
    finally:
        await late.stop()


async def test_a_silent_replica_makes_the_call_wait_out_the_lease(redis_url: str) -> None:
    a, b = await _replicas(redis_url, 2, SharedOptions(bus_lease_s=0.6, bus_ack_timeout_s=0.2, bus_heartbeat_s=0.1))
    try:
        async def never_done(_message: object) -> None:
            await asyncio.sleep(30)

        b.bus.on("keys", never_done)  # b receives but never acknowledges
        await a.l1.put("k", _entry("x"), ttl=60, tags=["all"])
        await a.l1.delete("k")
        delivery = a.near.last_delivery
        assert delivery is not None
        assert (delivery.expected, delivery.acked, delivery.complete, delivery.fenced) == (2, 1, False, True)
        assert delivery.waited_s >= 0.6
        assert not b.bus.trusted, "the silent replica's lease ran out: it serves no local copy"
        assert await b.l1.get("k") is None
    finally:
        for shared in (a, b):
            await shared.stop()


async def test_a_replica_whose_bus_is_down_serves_nothing_cached(redis_url: str) -> None:
    a, b = await _replicas(redis_url, 2)
    try:
        await a.l1.put("k", _entry("x"), ttl=60, tags=["all"])
        assert await b.l1.get("k") is not None
        resynced = asyncio.Event()

        async def note() -> None:
            resynced.set()

        b.bus.on_resync(note)
        admin = aioredis.Redis.from_url(redis_url)
        await admin.client_kill_filter(_type="pubsub")
        await admin.aclose()
        await asyncio.wait_for(resynced.wait(), 5)  # the bus resubscribed and dropped its near copies
        assert b.near.near.get_nowait("k") is None
        assert await b.l1.get("k") is not None, "served again from Redis once resubscribed"
    finally:
        for shared in (a, b):
            await shared.stop()


async def test_fill_race_does_not_keep_a_deleted_entry_near(three: list[SharedMode]) -> None:
    a, b, _ = three
    await a.l1.put("k", _entry("x"), ttl=60, tags=["all"])
    store = b.near
    assert isinstance(store, NearCachedStore)
    generation = store.bus.generation
    read = asyncio.create_task(store.get("k"))
    await a.l1.delete("k")
    await read
    if store.bus.generation != generation:
        assert store.near.get_nowait("k") is None
    assert await b.l1.get("k") is None


async def test_prefix_board_shares_what_each_replica_sent(redis_url: str) -> None:
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
    boards = [PrefixSummaryBoard(client, ["gpu-0", "gpu-1"], ttl_s=5, max_per_backend=3) for client in clients]
    try:
        hashes = path_hashes(["system", "doc-1", "doc-2", "question"])
        boards[0].record("gpu-0", zip(hashes[:3], (100, 600, 1100), strict=True))
        assert boards[1].cached_tokens("gpu-0", hashes) == 0
        await boards[0].publish()
        await boards[1].refresh()
        assert boards[1].cached_tokens("gpu-0", hashes) == 1100
        assert boards[1].cached_tokens("gpu-1", hashes) == 0
        assert boards[1].cached_tokens("gpu-0", path_hashes(["system", "doc-9"])) == 100
        boards[1].record("gpu-0", [(h, 5) for h in path_hashes(["a", "b", "c", "d", "e"])])
        await boards[1].publish()
        assert await clients[0].zcard("ragproxy:kv:{b:gpu-0}:prefixes") == 3, "bounded per backend"
    finally:
        for client in clients:
            await client.aclose()


async def test_a_followed_local_tier_loses_keys_removed_by_another_replica(three: list[SharedMode]) -> None:
    a, b, _ = three
    local = ResponseTier("l3", MemoryStore(make_policy("lru", 1 << 20)))
    b.follow(local)
    await local.put("k", _entry("x"), ttl=60, tags=["all"])
    await local.put("other", _entry("y"), ttl=60, tags=["all"])
    await a.l1.delete("k")
    assert await local.get("k") is None, "applied before b acknowledged"
    assert await local.get("other") is not None
    await a.l1.store.clear()
    assert await local.get("other") is None
