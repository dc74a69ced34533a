"""Shared mode through Redis Sentinel (``redis+sentinel://``): real redis-server processes — a master (and a
replica for the failover test) and a Sentinel monitoring it — the shared L1 store, the credit store and two proxy
replicas reaching the master only through the Sentinel URL."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from proxy.assembly.config import ConfigError, load_settings
from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.store import LedgerFilter, Reservation, ledger_entries
from tests.scale.replicas import provision_user, shared_replicas
from tests.scale.test_replicas import CREDIT, ask, sdk
from tests.support.processes import RedisServer, free_port, wait_for_port
from tiers.redis_connect import connect, parse_sentinel_url
from tiers.redis_store import RedisStore
from upstream_doubles.llm_server import FakeLLM

SERVICE = "mymaster"


def start_sentinel(master_port: int) -> RedisServer:
    """A Sentinel (``redis-server <conf> --sentinel``) monitoring the master on ``master_port``, quorum 1."""
    binary = shutil.which("redis-server")
    assert binary is not None
    port, directory = free_port(), Path(tempfile.mkdtemp(prefix="ragproxy-sentinel-"))
    conf = directory / "sentinel.conf"  # Sentinel rewrites its config file: a private, writable copy
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n"
                    f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                    f"sentinel failover-timeout {SERVICE} 3000\n")
    process = subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_for_port(port)
    return RedisServer(port=port, process=process, directory=directory)


def sentinel_url(sentinel: RedisServer) -> str:
    return f"redis+sentinel://127.0.0.1:{sentinel.port}/{SERVICE}/0"


def master_port(sentinel: RedisServer) -> int:
    with redis.Redis(port=sentinel.port, socket_timeout=1.0) as client:
        _host, port = client.sentinel_get_master_addr_by_name(SERVICE)
    return int(port)


def replicas_seen(sentinel: RedisServer) -> int:
    with redis.Redis(port=sentinel.port, socket_timeout=1.0) as client:
        return len(client.sentinel_slaves(SERVICE))


@pytest.fixture(scope="module")
def sentinel_pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and the Sentinel that names it, for the module."""
    master = RedisServer.start()
    sentinel = start_sentinel(master.port)
    yield master, sentinel
    sentinel.stop()
    master.stop()


@pytest.fixture
def via_sentinel(sentinel_pair: tuple[RedisServer, RedisServer]) -> Iterator[str]:
    """The Sentinel URL of an empty master (flushed before and after)."""
    master, sentinel = sentinel_pair
    with redis.Redis(port=master.port) as direct:
        direct.flushall()
        yield sentinel_url(sentinel)
        direct.flushall()


# -- configuration ----------------------------------------------------------------------------------------------


def test_the_url_names_sentinels_service_database_and_credentials() -> None:
    address = parse_sentinel_url("redis+sentinel://:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:5000/cache/3")
    assert address.sentinels == (("10.0.0.1", 26380), ("sentinel-b", 26379), ("::1", 5000))
    assert (address.service, address.db, address.username, address.password) == ("cache", 3, None, "s@cret")


@pytest.mark.parametrize("url", [
    "redis+sentinel://127.0.0.1:26379",              # no service
    "redis+sentinel:///mymaster",                    # no sentinel
    "redis+sentinel://127.0.0.1:port/mymaster",      # bad port
    "redis+sentinel://127.0.0.1:26379/mymaster/x",   # bad db
    "redis+sentinel://a:1,,b:2/mymaster",            # empty host
    "sentinel://127.0.0.1:26379/mymaster",           # unknown scheme
])
def test_a_malformed_url_is_a_config_error_naming_the_key(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^redis\.url = "):
        load_settings(env={}, overrides={"redis.url": url})


def test_a_sentinel_url_is_not_a_cluster() -> None:
    url = "redis+sentinel://127.0.0.1:26379/mymaster"
    assert load_settings(env={}, overrides={"redis.url": url}).redis.url == url
    with pytest.raises(ConfigError, match=r"^redis\.cluster = "):
        load_settings(env={}, overrides={"redis.url": url, "redis.cluster": True})


# -- the stores ---------------------------------------------------------------------------------------------------


async def test_the_shared_store_reaches_the_master_through_the_sentinel(
        sentinel_pair: tuple[RedisServer, RedisServer], via_sentinel: str) -> None:
    master, _ = sentinel_pair
    store = RedisStore(via_sentinel, prefix="sent", timeout=1.0)
    try:
        assert await store.put("answer", b"forty-two", ttl=60, tags=["doc:1"])
        assert await store.get("answer") == b"forty-two"
        with redis.Redis(port=master.port) as direct:
            assert direct.exists(store.value_key("answer")) == 1
        assert await store.delete_tag("doc:1") == 1
        assert await store.get("answer") is None
    finally:
        await store.close()


async def test_a_full_pool_waits_for_a_connection_instead_of_failing(via_sentinel: str) -> None:
    client = connect(via_sentinel, timeout_s=2.0, max_connections=2)
    try:
        # 10 blocking reads of 0.1 s on 2 connections: each waits its turn (a plain Sentinel pool would raise
        # "Too many connections")
        started = time.monotonic()
        replies = await asyncio.gather(*(client.blpop(["nothing"], timeout=0.1) for _ in range(10)))
        assert replies == [None] * 10
        assert time.monotonic() - started >= 0.45, "no more than 2 ran at once"
    finally:
        await client.aclose()


async def test_the_credit_store_reserves_and_settles_through_the_sentinel(via_sentinel: str) -> None:
    store = RedisCreditStore.from_url(via_sentinel, timeout_s=1.0)
    try:
        assert await store.top_up("ann", 100, tenant="acme") == 100
        assert isinstance(await store.reserve("req-1", "ann", 30, ttl=60), Reservation)
        assert (await store.balance("ann")).held == 30
        assert await store.release("req-1", "ann")
        assert (await store.balance("ann")).available == 100
    finally:
        await store.close()


# -- two proxy replicas -------------------------------------------------------------------------------------------


def test_two_replicas_share_the_cache_and_the_credits_through_the_sentinel(
        fake_llm_thread: FakeLLM, via_sentinel: str) -> None:
    key = provision_user(via_sentinel, 10 * CREDIT)
    settings = {"auth.mode": "keys", "credits.enabled": True}
    with shared_replicas(2, fake_llm_thread.url, via_sentinel, **settings) as (first, second):
        assert ask(sdk(first, key), "through the sentinel?")[0] == "MISS"
        assert ask(sdk(second, key), "through the sentinel?")[0] == "HIT"

    async def audit() -> tuple[int, int, int]:
        store = RedisCreditStore.from_url(via_sentinel)
        try:
            account = await store.balance("ann")
            entries = [e async for e in ledger_entries(store, LedgerFilter(user="ann"))]
            return account.available, account.held, len([e for e in entries if e.kind == "charge"])
        finally:
            await store.close()

    available, held, charges = asyncio.run(audit())
    assert charges == 2 and held == 0, "both requests reserved and settled on the shared store"
    assert available < 10 * CREDIT
    assert fake_llm_thread.log.count("/v1/chat/completions") == 1


# -- failover -----------------------------------------------------------------------------------------------------


async def test_the_store_follows_a_failover_to_the_promoted_replica() -> None:
    master = RedisServer.start()
    replica = RedisServer.start(None, "--replicaof", "127.0.0.1", str(master.port))
    sentinel = start_sentinel(master.port)
    store = RedisStore(sentinel_url(sentinel), prefix="fo", timeout=1.0)
    try:
        deadline = time.monotonic() + 20
        while not replicas_seen(sentinel):
            assert time.monotonic() < deadline, "the Sentinel never saw the replica"
            await asyncio.sleep(0.2)
        assert await store.put("before", b"1", ttl=600)
        with redis.Redis(port=replica.port) as copy:
            while not copy.exists(store.value_key("before")):  # replicated before the master dies
                assert time.monotonic() < deadline, "the replica never got the entry"
                await asyncio.sleep(0.1)
        master.stop()
        deadline = time.monotonic() + 30
        while master_port(sentinel) != replica.port:
            assert time.monotonic() < deadline, "the Sentinel did not promote the replica"
            await asyncio.sleep(0.2)
        while True:  # the first calls may still meet the dead master's connections
            try:
                assert await store.put("after", b"2", ttl=600)
                break
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                assert time.monotonic() < deadline, "the store never reached the new master"
                await asyncio.sleep(0.2)
        assert await store.get("before") == b"1"
        assert await store.get("after") == b"2"
        with redis.Redis(port=replica.port) as promoted:
            assert promoted.exists(store.value_key("after")) == 1
    finally:
        await store.close()
        for server in (sentinel, replica, master):
            server.stop()
