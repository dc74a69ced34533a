"""RedisStore beyond the shared contract: prefixes, and a real 3-master Redis Cluster (the conformance suite runs
against standalone Redis; layout, budget, tag index and tombstones: tests/test_redis_admission.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.redis_cluster import RedisClusterProcesses, cluster_available
from tiers.redis_store import RedisStore


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    made = RedisStore(redis_url, prefix="test")
    yield made
    await made.close()


async def test_prefixes_isolate_stores(redis_url: str) -> None:
    first, second = RedisStore(redis_url, prefix="one"), RedisStore(redis_url, prefix="two")
    try:
        await first.put("k", b"1", tags=["t"])
        assert await second.get("k") is None
        assert await second.clear() == 0
        assert await first.get("k") == b"1"
    finally:
        await first.close()
        await second.close()


# -- Redis Cluster ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """A 3-master Redis Cluster on free loopback ports (no replicas)."""
    if not cluster_available():
        pytest.skip("redis-cli is not installed")
    with RedisClusterProcesses(masters=3) as cluster:
        yield cluster.url


async def test_works_on_redis_cluster(cluster_url: str) -> None:
    store = RedisStore(cluster_url, prefix="clustered")
    try:
        keys = [f"key-{i}" for i in range(60)]
        # one at a time: 60 concurrent first writes open 60 connections at once, and under CPU load redis-py's
        # cluster client (8.1) can disconnect a connection that another command is still setting up
        # (AttributeError: 'NoneType' object has no attribute 'writelines'); in the proxy the tier turns that
        # into a miss. What is under test here is the layout across slots, not the client's connection handling.
        for i, k in enumerate(keys):
            await store.put(k, k.encode(), tags=["all", f"mod:{i % 3}"])
        assert await store.get("key-7") == b"key-7"
        assert sorted(await store.keys_with_tag("all")) == sorted(keys)
        assert (await store.stats()).entries == 60
        assert await store.delete_tag("mod:0") == 20
        assert len(await store.keys_with_tag("all")) == 40
        assert await store.delete("key-1") is True
        await store.put("short", b"s", ttl=0.05, tags=["all"])
        await asyncio.sleep(0.1)
        assert await store.get("short") is None
        assert await store.clear() == 39
        assert (await store.stats()).entries == 0
    finally:
        await store.close()
