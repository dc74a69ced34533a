"""The shared L1's own admission and eviction in Redis (``tiers.redis_scripts``), against a real redis-server:
the Lua policy equals the in-process GreedyDual reference step for step, the budget holds, answers are stored
compressed, and entries pushed out of Redis are still invalidated everywhere (tombstones and eviction notices)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from loadtest.responses import ResponseGenerator
from proxy.assembly.config import ConfigError, load_settings
from proxy.cache_tiers.shared_mode import SharedMode, build_shared
from tests.support.nq_open import needs_nq_open
from tests.tiers.test_redis_store import cluster_url  # noqa: F401  (the 3-master cluster fixture)
from tiers.entry import CachedResponse
from tiers.invalidation import Invalidator, Selector
from tiers.invalidation_bus import InvalidationBus
from tiers.memory import MemoryStore
from tiers.near_cache import NearCachedStore
from tiers.policies.greedydual import GreedyDualPolicy
from tiers.policies.lru import LRUPolicy
from tiers.redis_store import RedisStore


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    made = RedisStore(redis_url, prefix="adm", max_bytes=1000)
    yield made
    await made.close()


async def test_an_entry_and_its_bookkeeping_share_a_cluster_slot(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="test", shards=3)
    try:
        for key in ("", "plain", "{x}", "a}b", "ключ"):
            base = f"test:{{s{store.shard(key)}}}"
            assert key_slot(store.value_key(key).encode()) == key_slot(f"{base}:e".encode())
        await store.put("plain", b"v", tags=["t", "all"])
        base = f"test:{{s{store.shard('plain')}}}"
        names = sorted(str(n, "utf-8") for n in await store.client.keys("test:*"))
        assert names == [f"{base}:e", f"{base}:m", f"{base}:q", f"{base}:t:t", f"{base}:v:plain"], \
            "a broad tag (all) has no index of its own"
    finally:
        await store.close()


async def test_the_tag_index_is_exact_and_never_expires(store: RedisStore) -> None:
    await store.put("a", b"1", tags=["t"], ttl=0.05)
    await store.put("b", b"2", tags=["t"], ttl=60)
    await store.put("c", b"3", tags=["t"])
    await store.put("c", b"3", tags=["other"])  # overwritten without the tag
    index = "adm:{s0}:t:t"
    assert await store.client.smembers(index) == {b"a", b"b"}
    assert await store.client.pttl(index) == -1, "volatile-* eviction never drops the index"
    await asyncio.sleep(0.1)
    assert await store.keys_with_tag("t") == ["b"]
    assert await store.get("a") is None  # settles the expired entry
    assert await store.client.smembers(index) == {b"b"}


async def test_accepts_an_existing_client(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    store = RedisStore(client, prefix="shared")
    await store.put("k", b"v")
    assert await store.get("k") == b"v"
    await store.close()  # not ours: still usable
    assert await client.get(store.value_key("k")) == b"v"
    await client.aclose()


async def test_the_policy_equals_the_greedydual_reference(redis_url: str) -> None:
    """A seeded mix of puts (sizes, costs, overwrites), reads and deletes: same admissions, same residents, same
    bytes as ``GreedyDualPolicy(frequency=True, bypass=True)`` after every step."""
    store = RedisStore(redis_url, prefix="ref", max_bytes=3000)
    reference = GreedyDualPolicy(3000, frequency=True, bypass=True)
    rng = random.Random(11)
    keys = [f"k{i}" for i in range(40)]
    sizes: dict[str, int] = {}
    try:
        for step in range(500):
            key, roll = rng.choice(keys), rng.random()
            if roll < 0.5:
                size, cost = rng.randrange(0, 600), rng.choice([0.5, 1.0, 2.5, rng.random() * 3])
                admitted = await store.put(key, b"x" * size, cost=cost, tags=["all", f"doc:{size % 3}"])
                assert admitted == reference.insert(key, size, cost).admitted, step
                sizes[key] = size
            elif roll < 0.9:
                value = await store.get(key)
                assert (value is not None) == (key in reference), step
                if value is not None:
                    reference.hit(key)
            else:
                assert await store.delete(key) == (key in reference), step
                reference.remove(key)
            assert sorted(await store.keys_with_tag("all")) == sorted(k for k in keys if k in reference), step
            assert (await store.stats()).bytes == reference.used, step
        assert store.evictions > 50 and store.bypassed > 0, "the trace exercised eviction and bypass"
        for doc in range(3):
            assert sorted(await store.keys_with_tag(f"doc:{doc}")) == sorted(
                k for k in keys if k in reference and sizes[k] % 3 == doc)
    finally:
        await store.close()


async def test_proven_entries_outlast_a_stream_of_one_hit_wonders(store: RedisStore) -> None:
    popular = [f"popular-{i}" for i in range(5)]
    for key in popular:
        assert await store.put(key, b"p" * 100)
    for _ in range(4):
        for key in popular:
            assert await store.get(key) is not None
    lru = MemoryStore(LRUPolicy(1000))
    for key in popular:
        lru.put_nowait(key, b"p" * 100)
    for n in range(10):
        await store.put(f"once-{n}", b"o" * 100)
        lru.put_nowait(f"once-{n}", b"o" * 100)
        assert (await store.stats()).bytes <= 1000
    assert all([await store.get(key) is not None for key in popular])
    assert not any(lru.get_nowait(key) is not None for key in popular), "LRU would have lost every one of them"


async def test_the_budget_holds_in_every_shard(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="sharded", max_bytes=4000, shards=4)
    rng = random.Random(3)
    try:
        assert await store.put("too-big", b"x" * 1001) is False, "larger than a shard's share of the budget"
        assert store.bypassed == 1
        for n in range(300):
            await store.put(f"k{n}", b"x" * rng.randrange(50, 400), cost=rng.random())
        used = [int(await store.client.hget(f"sharded:{{s{s}}}:m", "used") or 0) for s in range(4)]
        assert all(0 < u <= 1000 for u in used)
        assert (await store.stats()).bytes == sum(used)
        assert store.evictions > 0
    finally:
        await store.close()


@needs_nq_open
async def test_answers_are_stored_compressed_with_the_builtin_dictionary(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="lz4", compress=True)
    try:
        raw_total = stored_total = 0
        generator = ResponseGenerator(seed=1)
        for seed in range(200):
            answer = CachedResponse(body=generator.completion_bytes(), kind="chat", model="m",
                                    meta={"question": f"question {seed}?"}).encode()
            assert await store.put(f"a{seed}", answer)
            assert await store.get(f"a{seed}") == answer
            raw_total += len(answer)
            stored_total += int(await store.client.strlen(store.value_key(f"a{seed}")))
        assert raw_total / stored_total > 1.5
        assert (await store.stats()).bytes == stored_total, "the store counts what Redis holds"
        noise = random.Random(1).randbytes(3000)
        await store.put("noise", noise)
        assert await store.client.strlen(store.value_key("noise")) == len(noise), "incompressible: stored raw"
        assert await store.get("noise") == noise
    finally:
        await store.close()


async def test_a_value_that_does_not_decode_is_a_miss_and_goes(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="corrupt", compress=True)
    try:
        await store.put("k", b'{"answer": "' + b"abc" * 200 + b'"}', tags=["doc:1"])
        await store.client.set(store.value_key("k"), b"\x01\x07garbage")
        assert await store.get("k") is None
        assert await store.keys_with_tag("doc:1", include_evicted=True) == []
    finally:
        await store.close()


async def test_evicted_entries_keep_a_tombstone_until_released_or_due(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="tomb", max_bytes=300, keep_evicted_s=0.5)
    heard: list[list[str]] = []
    store.on_evicted = heard.append
    try:
        await store.put("cheap", b"c" * 100, cost=0.01, tags=["doc:1", "all"])
        await store.put("b", b"b" * 100, tags=["doc:2"])
        await store.put("c", b"c" * 100, tags=["doc:2"])
        assert await store.put("dear", b"d" * 100, cost=100.0, tags=["doc:2"])
        assert heard == [["cheap"]]
        assert await store.get("cheap") is None
        assert await store.keys_with_tag("doc:1") == []
        assert await store.keys_with_tag("doc:1", include_evicted=True) == ["cheap"]
        assert await store.keys_with_tag("all", include_evicted=True) == ["cheap"]
        await store.release(["cheap"])
        assert await store.keys_with_tag("doc:1", include_evicted=True) == []

        assert await store.put("cheap", b"c" * 100, cost=0.001, tags=["doc:1"]) is False, "worth less: bypassed"
        assert await store.delete("b")
        assert await store.put("cheap2", b"c" * 100, cost=0.02, tags=["doc:1"])
        assert await store.put("dear2", b"d" * 100, cost=100.0)
        assert await store.keys_with_tag("doc:1", include_evicted=True) == ["cheap2"]
        assert await store.remove_tag("doc:1") == (0, ["cheap2"]), "a tag removal reports tombstoned keys too"
        assert await store.delete("c")
        assert await store.put("cheap3", b"c" * 100, cost=0.02, tags=["doc:3"])
        assert await store.put("dear3", b"d" * 100, cost=100.0)
        assert await store.keys_with_tag("doc:3", include_evicted=True) == ["cheap3"]
        await asyncio.sleep(0.6)
        await store.delete("dear3")
        await store.put("later", b"l" * 10, cost=1000.0)  # puts reap tombstones that fell due
        assert await store.keys_with_tag("doc:3", include_evicted=True) == []
        assert await store.client.zcard("tomb:{s0}:z") == 0
    finally:
        await store.close()


async def test_expired_entries_leave_no_tombstone_and_free_their_budget(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="exp", max_bytes=200, keep_evicted_s=30)
    try:
        await store.put("x", b"x" * 150, ttl=0.05, tags=["doc:1"])
        await asyncio.sleep(0.1)
        assert await store.keys_with_tag("doc:1", include_evicted=True) == []
        assert await store.put("y", b"y" * 150)
        assert store.evictions == 0, "the expired entry was reaped, not evicted"
        assert await store.client.hlen("exp:{s0}:e") == 1
    finally:
        await store.close()


async def test_a_value_redis_evicted_leaves_a_tombstone(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="lost", keep_evicted_s=30)
    try:
        await store.put("k", b"v" * 50, ttl=60, tags=["doc:9"])
        await store.client.delete(store.value_key("k"))  # what maxmemory-policy volatile-lru does
        assert await store.get("k") is None
        assert await store.keys_with_tag("doc:9") == []
        assert await store.keys_with_tag("doc:9", include_evicted=True) == ["k"]
        assert (await store.stats()).entries == 0
    finally:
        await store.close()


# -- shared mode ---------------------------------------------------------------------------------------------


async def _replicas(url: str, count: int = 3, **overrides: object) -> list[SharedMode]:
    settings = load_settings(env={}, overrides={"redis.url": url, "redis.l1_compress": False, **overrides})
    replicas = []
    for _ in range(count):
        shared = build_shared(settings)
        assert shared is not None
        await shared.start()
        replicas.append(shared)
    return replicas


def _entry(text: str, cost: float) -> CachedResponse:
    return CachedResponse(body=f'{{"answer": "{text}"}}'.encode(), kind="chat", model="m", cost=cost)


async def _evict_from_redis(writer: SharedMode, key: str) -> None:
    for n in range(20):
        await writer.l1.put(f"filler-{n}", _entry("f" * 200, 100.0), ttl=60, tags=["all"])
        if await writer.near.shared.get(key) is None:
            return
    raise AssertionError(f"{key} was never evicted")


@pytest.fixture
async def three(redis_url: str) -> AsyncIterator[list[SharedMode]]:
    replicas = await _replicas(redis_url, **{"redis.l1_max_bytes": 2000})
    yield replicas
    for shared in replicas:
        await shared.stop()


async def test_every_replica_drops_its_copies_of_entries_redis_evicted(three: list[SharedMode]) -> None:
    a, b, c = three
    assert await a.l1.put("k", _entry("cheap", 0.001), ttl=60, tags=["all", "doc:7"])
    for other in (b, c):
        assert await other.l1.get("k") is not None
        assert other.near.near.get_nowait("k") is not None
    await _evict_from_redis(a, "k")
    for _ in range(100):
        if all(r.near.near.get_nowait("k") is None for r in three) and not await a.l1.store.keys_with_tag("doc:7"):
            break
        await asyncio.sleep(0.02)
    assert all(r.near.near.get_nowait("k") is None for r in three), "the eviction notice reached every replica"
    assert await a.l1.store.keys_with_tag("doc:7") == [], "and the tombstone was released"
    assert a.summary()["shared_evictions"] > 0


async def test_invalidating_an_evicted_entry_still_reaches_the_near_copies(three: list[SharedMode]) -> None:
    """The eviction notice is held back (as if lost): the tombstone lets the invalidation find the key."""
    a, b, c = three
    a.near.notify_delay_s = 60.0
    await a.l1.put("k", _entry("cheap", 0.001), ttl=60, tags=["all", "doc:7"])
    for other in (b, c):
        assert await other.l1.get("k") is not None
    await _evict_from_redis(a, "k")
    assert b.near.near.get_nowait("k") is not None, "a near copy outlived the Redis entry"
    outcome = await Invalidator([a.l1]).invalidate(Selector(documents=("7",)))
    assert outcome.keys == ["k"]
    for replica in three:
        assert await replica.l1.get("k") is None


async def test_a_put_the_budget_declines_leaves_no_copy_anywhere(three: list[SharedMode]) -> None:
    a, b, _ = three
    assert await a.l1.put("huge", _entry("h" * 3000, 1.0), ttl=60, tags=["all"]) is False
    assert a.l1.counters.rejected == 1
    assert a.near.near.get_nowait("huge") is None
    assert await b.l1.get("huge") is None


async def test_settings_reach_the_shared_store(redis_url: str) -> None:
    (shared,) = await _replicas(redis_url, 1, **{"redis.l1_max_bytes": 12345, "redis.near_ttl_s": 5})
    try:
        store = shared.near.shared
        assert (store.max_bytes, store.shards, store.compress) == (12345, 1, False)
        assert store.keep_evicted_s >= 5
    finally:
        await shared.stop()
    defaults = load_settings(env={}).redis
    assert (defaults.l1_max_bytes, defaults.l1_shards, defaults.l1_compress) == (1024**3, 0, True)
    with pytest.raises(ConfigError):
        load_settings(env={}, overrides={"redis.l1_shards": -1})


async def test_near_copies_may_not_outlive_tombstones(redis_url: str) -> None:
    shared = RedisStore(redis_url, keep_evicted_s=1.0)
    with pytest.raises(ValueError, match="keep_evicted_s"):
        NearCachedStore(MemoryStore(LRUPolicy(1000)), shared, InvalidationBus(redis_url), near_ttl_s=30)
    await shared.close()


# -- Redis Cluster -------------------------------------------------------------------------------------------


async def test_budget_and_tombstones_on_redis_cluster(cluster_url: str) -> None:  # noqa: F811
    store = RedisStore(cluster_url, prefix="adm-cluster", max_bytes=6000, shards=6, compress=True,
                       keep_evicted_s=30)
    try:
        slots = {key_slot(f"adm-cluster:{{s{shard}}}:e".encode()) for shard in range(6)}
        assert len(slots) == 6
        rng = random.Random(5)
        for n in range(120):
            await store.put(f"k{n}", rng.randbytes(rng.randrange(100, 600)), cost=rng.random(),
                            tags=["all", f"doc:{n % 4}"], ttl=60)
        assert store.evictions > 0
        stats = await store.stats()
        assert 0 < stats.bytes <= 6000
        live = await store.keys_with_tag("all")
        assert len(live) == stats.entries
        with_tombstones = await store.keys_with_tag("doc:1", include_evicted=True)
        assert set(await store.keys_with_tag("doc:1")) < set(with_tombstones)
        removed, keys = await store.remove_tag("doc:1")
        assert sorted(keys) == sorted(with_tombstones) and removed < len(keys)
        assert await store.keys_with_tag("doc:1", include_evicted=True) == []
        assert await store.clear() == stats.entries - removed
        assert (await store.stats()).entries == 0
    finally:
        await store.close()
