"""The Redis stores on a real three-node Redis Cluster: every script's keys share one slot (hash tags)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest

from proxy.auth.redis_keys import RedisKeyStore
from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.store import ChargeDetails, InsufficientCredit, LedgerFilter, Reservation, ledger_entries
from proxy.idempotency.records import Claimed, Kept
from proxy.idempotency.redis_store import RedisIdempotencyStore
from tests.support.redis_cluster import RedisClusterProcesses, cluster_available

CREDIT = 1_000_000
T0 = 1_800_000_000.0


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """A 3-master Redis Cluster on free loopback ports (no replicas)."""
    if not cluster_available():
        pytest.skip("redis-cli is not installed")
    with RedisClusterProcesses(masters=3) as cluster:
        yield cluster.plain_url


@pytest.fixture
async def cluster_store(cluster_url: str) -> AsyncIterator[RedisCreditStore]:
    store = RedisCreditStore.from_url(cluster_url, cluster=True, prefix=f"t{time.monotonic_ns()}")
    yield store
    await store.close()


async def test_credit_operations_for_users_spread_over_slots(cluster_store: RedisCreditStore) -> None:
    users = [f"user-{i}" for i in range(12)] + ["{odd}", "a:b c"]
    for user in users:
        await cluster_store.top_up(user, 2 * CREDIT, tenant="acme")
        held = await cluster_store.reserve("r1", user, CREDIT, 10, now=T0)
        assert isinstance(held, Reservation)
        assert isinstance(await cluster_store.reserve("r2", user, 2 * CREDIT, 10, now=T0), InsufficientCredit)
        await cluster_store.reserve("r3", user, CREDIT // 2, 10, now=T0)
        done = await cluster_store.settle("r1", user, CREDIT // 4, ChargeDetails(model="m"), now=T0 + 1)
        assert (done.outcome, done.charged) == ("settled", CREDIT // 4)
        assert not await cluster_store.release("r1", user)
    assert await cluster_store.reap_expired(now=T0 + 11) == len(users)
    for user in users:
        account = await cluster_store.balance(user)
        assert (account.available, account.held) == (2 * CREDIT - CREDIT // 4, 0)
    entries = [e async for e in ledger_entries(cluster_store, LedgerFilter(), page_size=5)]
    assert len(entries) == 2 * len(users)
    assert sum(e.amount for e in entries) == len(users) * (2 * CREDIT - CREDIT // 4)


async def test_api_keys(cluster_url: str) -> None:
    keys = RedisKeyStore.from_url(cluster_url, cluster=True, prefix=f"t{time.monotonic_ns()}")
    try:
        created = await keys.create("ann", "acme")
        assert (await keys.lookup(created.plaintext)) == created.record
        assert await keys.revoke(created.record.key_id)
        assert await keys.lookup(created.plaintext) is None
        assert [k.key_id for k in await keys.list(include_revoked=True)] == [created.record.key_id]
    finally:
        await keys.close()


async def test_idempotency_bytes_counted_per_user_and_in_all_across_slots(cluster_url: str) -> None:
    prefix = f"t{time.monotonic_ns()}"
    answer = b"x" * 20_000  # counted 20,480 and more: room for three in all, two a user
    store = RedisIdempotencyStore.from_url(cluster_url, cluster=True, prefix=prefix, max_bytes=3 * 21_000,
                                           max_bytes_per_user=2 * 21_000)
    try:
        for user, key in [("ann", "a0"), ("ann", "a1"), ("bob", "b0"), ("cy", "c0")]:
            assert isinstance(await store.claim(user, key, "p", "o", 60), Claimed)
            assert await store.keep(user, key, "o", answer, 600)
        kept = [key for user, key in [("ann", "a0"), ("ann", "a1"), ("bob", "b0"), ("cy", "c0")]
                if isinstance(await store.claim(user, key, "p", "probe", 60), Kept)]
        assert kept == ["a1", "b0", "c0"], "the oldest answer of the user holding the most went, in another slot"
        assert int(await store.client.get(f"{prefix}:{{#budget}}total") or 0) <= 3 * 21_000
    finally:
        await store.close()
