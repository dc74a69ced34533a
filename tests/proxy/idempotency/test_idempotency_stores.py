"""Both idempotency stores (process memory, Redis) against one contract: keys bounded per user, a running claim
never evicted, claims owned by the request that made them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from proxy.idempotency.memory_store import MemoryIdempotencyStore
from proxy.idempotency.records import Claimed, Full, IdempotencyStore, Kept, Mismatch, Running
from proxy.idempotency.redis_store import RedisIdempotencyStore

RUNNING_S, KEPT_S = 600.0, 86_400.0


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[IdempotencyStore]:
    made: IdempotencyStore = (MemoryIdempotencyStore(max_entries=1_000, per_user=5) if request.param == "memory"
                              else RedisIdempotencyStore.from_url(redis_url, per_user=5))
    yield made
    await made.close()


async def _finished(store: IdempotencyStore, user: str, key: str) -> None:
    assert isinstance(await store.claim(user, key, f"print-{key}", f"owner-{key}", RUNNING_S), Claimed)
    await store.keep(user, key, f"owner-{key}", f"answer-{key}".encode(), KEPT_S)


async def test_one_user_s_flood_of_keys_evicts_only_its_own_oldest(store: IdempotencyStore) -> None:
    """In embedded mode the store used to be one LRU for every user: a user sending more keys than it held pushed
    out everyone else's, whose retries then ran, and were charged, again."""
    await _finished(store, "bob", "bob-done")
    assert isinstance(await store.claim("bob", "bob-running", "print-run", "owner-run", RUNNING_S), Claimed)
    for n in range(12):
        await _finished(store, "ann", f"ann-{n}")
    assert await store.claim("bob", "bob-done", "print-bob-done", "x", RUNNING_S) == Kept(b"answer-bob-done")
    assert isinstance(await store.claim("bob", "bob-running", "print-run", "x", RUNNING_S), Running)
    assert await store.claim("ann", "ann-11", "print-ann-11", "x", RUNNING_S) == Kept(b"answer-ann-11")
    assert isinstance(await store.claim("ann", "ann-0", "print-ann-0", "x", RUNNING_S), Claimed), "evicted: free"


async def test_a_running_claim_is_never_evicted(store: IdempotencyStore) -> None:
    for n in range(5):
        assert isinstance(await store.claim("ann", f"k{n}", "p", f"o{n}", RUNNING_S), Claimed)
    assert isinstance(await store.claim("ann", "k5", "p", "o5", RUNNING_S), Full), "no room but running claims"
    await store.keep("ann", "k2", "o2", b"two", KEPT_S)
    assert isinstance(await store.claim("ann", "k5", "p", "o5", RUNNING_S), Claimed), "the finished one made room"
    for n in (0, 1, 3, 4):
        assert isinstance(await store.claim("ann", f"k{n}", "p", "other", RUNNING_S), Running)
    assert isinstance(await store.claim("ann", "k2", "p", "o2", RUNNING_S), Full), "k2's answer went; five run"


async def test_claims_belong_to_their_owner(store: IdempotencyStore) -> None:
    assert isinstance(await store.claim("ann", "k", "p", "first", RUNNING_S), Claimed)
    assert isinstance(await store.claim("ann", "k", "p", "first", RUNNING_S), Claimed), "a retried claim is its own"
    assert isinstance(await store.claim("ann", "k", "p", "second", RUNNING_S), Running)
    assert isinstance(await store.claim("ann", "k", "other body", "second", RUNNING_S), Mismatch)
    await store.keep("ann", "k", "second", b"not yours", KEPT_S)
    await store.free("ann", "k", "second")
    assert isinstance(await store.claim("ann", "k", "p", "third", RUNNING_S), Running), "still the first's claim"
    await store.keep("ann", "k", "first", b"answer", KEPT_S)
    await store.free("ann", "k", "first")
    assert await store.claim("ann", "k", "p", "third", RUNNING_S) == Kept(b"answer"), "a kept answer is not freed"


async def test_the_memory_store_full_evicts_from_the_user_holding_the_most() -> None:
    store = MemoryIdempotencyStore(max_entries=10, per_user=6)
    for n in range(6):
        await _finished(store, "ann", f"ann-{n}")
    for n in range(3):
        await _finished(store, "bob", f"bob-{n}")
    for n in range(3):
        await _finished(store, "cy", f"cy-{n}")
    assert store.entries == 10
    for n in range(3):
        kept = await store.claim("bob", f"bob-{n}", f"print-bob-{n}", "x", RUNNING_S)
        assert kept == Kept(f"answer-bob-{n}".encode())
    assert isinstance(await store.claim("ann", "ann-0", "print-ann-0", "x", RUNNING_S), Claimed), "ann's oldest went"
