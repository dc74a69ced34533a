"""RedisStore beyond the shared contract: prefixes, and a real 3-master Redis Cluster (the conformance suite runs
against standalone Redis; layout, budget, tag index and tombstones: tests/test_redis_admission.py)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from tests.support.processes import RedisServer, free_port
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


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """A 3-master Redis Cluster on free loopback ports (no replicas)."""
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed")
    servers = [
        RedisServer.start(_cluster_port(), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        for _ in range(3)
    ]
    try:
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{s.port}" for s in servers),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            infos = [redis.Redis(port=s.port).cluster("info") for s in servers]
            if all(info.get("cluster_state") == "ok" for info in infos):
                break
            time.sleep(0.1)
        else:
            raise TimeoutError("cluster did not reach state ok")
        yield f"redis+cluster://127.0.0.1:{servers[0].port}/0"
    finally:
        for server in servers:
            server.stop()


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
