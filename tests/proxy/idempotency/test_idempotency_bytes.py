"""Both idempotency stores (process memory, Redis) bounded in bytes: per user and in all.

The stores were bounded only by how many keys they held: keys with multi-megabyte answers (embedding answers of
thousands of vectors) grew the proxy, or Redis, by gigabytes within the key caps."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from proxy.idempotency.memory_store import MemoryIdempotencyStore
from proxy.idempotency.records import Claimed, IdempotencyStore, Kept, held_bytes
from proxy.idempotency.redis_store import RedisIdempotencyStore, allocated

RUNNING_S, KEPT_S = 600.0, 86_400.0
ANSWER = 114_000  # Redis counts 114,688 bytes for it (an allocator class); room for 5 a user, 12 in all, in both
PER_USER = 5 * 115_000
OVERALL = 12 * 115_000


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[IdempotencyStore]:
    made: IdempotencyStore = (
        MemoryIdempotencyStore(max_entries=10_000, max_bytes=OVERALL, max_bytes_per_user=PER_USER)
        if request.param == "memory"
        else RedisIdempotencyStore.from_url(redis_url, max_bytes=OVERALL, max_bytes_per_user=PER_USER))
    yield made
    await made.close()


async def _finished(store: IdempotencyStore, user: str, key: str, size: int = ANSWER) -> bool:
    assert isinstance(await store.claim(user, key, f"print-{key}", f"owner-{key}", RUNNING_S), Claimed)
    return await store.keep(user, key, f"owner-{key}", key.encode().ljust(size, b"."), KEPT_S)


async def _replayable(store: IdempotencyStore, user: str, key: str) -> bool:
    """Whether ``key`` still replays (a claim that finds it free stays claimed: it is freed again)."""
    claim = await store.claim(user, key, f"print-{key}", "probe", RUNNING_S)
    await store.free(user, key, "probe")
    return isinstance(claim, Kept)


async def test_a_user_holds_at_most_its_byte_budget_oldest_going_first(store: IdempotencyStore) -> None:
    for n in range(20):
        assert await _finished(store, "ann", f"ann-{n}"), "room is made by dropping the user's oldest"
    kept = [n for n in range(20) if await _replayable(store, "ann", f"ann-{n}")]
    assert kept == list(range(15, 20)), "five answers fit the user's budget: the newest five"
    assert len(kept) * held_bytes("ann-19", b"x" * ANSWER) <= PER_USER


async def test_an_answer_larger_than_the_user_s_budget_is_not_kept(store: IdempotencyStore) -> None:
    assert await _finished(store, "ann", "small")
    assert not await _finished(store, "ann", "huge", size=PER_USER + 1)
    assert isinstance(await store.claim("ann", "huge", "print-huge", "again", RUNNING_S), Claimed), "freed: runs again"
    assert await _replayable(store, "ann", "small"), "the user's other answers stay"


async def test_the_whole_store_full_drops_from_the_user_holding_the_most_bytes(store: IdempotencyStore) -> None:
    for user in ("bob", "cy"):
        for n in range(3):
            assert await _finished(store, user, f"{user}-{n}")
    for n in range(5):
        assert await _finished(store, "ann", f"ann-{n}")
    for n in range(3):
        assert await _finished(store, "dee", f"dee-{n}")
    # 14 answers against room for 12: ann (5, the most) gave her two oldest
    assert [n for n in range(5) if await _replayable(store, "ann", f"ann-{n}")] == [2, 3, 4]
    for user in ("bob", "cy", "dee"):
        assert all([await _replayable(store, user, f"{user}-{n}") for n in range(3)]), user


def test_redis_counts_answers_as_its_allocator_takes_them() -> None:
    assert allocated(100) == 100
    assert allocated(3_787_549) == 4 * 1024**2, "jemalloc's class above 3.5 MiB"
    assert allocated(4 * 1024**2) == 4 * 1024**2
    assert allocated(4 * 1024**2 + 1) == 5 * 1024**2


async def test_redis_counts_the_bytes_it_holds(redis_url: str) -> None:
    """The per-user and overall counts in Redis follow what it holds, so the bound is on real bytes."""
    store = RedisIdempotencyStore.from_url(redis_url, prefix="budget-test", max_bytes=OVERALL,
                                           max_bytes_per_user=PER_USER)
    try:
        for n in range(40):
            await _finished(store, f"user-{n % 8}", f"k{n}")
        held = 0
        async for name in store.client.scan_iter(match="budget-test:{*}:*"):
            answer = await store.client.hget(name, "answer")
            held += len(answer or b"")
        total = int(await store.client.get("budget-test:{#budget}total") or 0)
        assert held <= total <= OVERALL
        assert total - held <= total / 4, "the count is the answers' bytes as Redis allocates them"
    finally:
        await store.close()


async def test_redis_takes_a_user_s_counts_in_the_order_they_were_made(redis_url: str) -> None:
    """Two replicas keep answers of one user at once: the count read first may reach the overall count last. Taken,
    it would understate what the user holds."""
    store = RedisIdempotencyStore.from_url(redis_url, prefix="order-test", max_bytes=OVERALL,
                                           max_bytes_per_user=PER_USER)
    try:
        for n in range(3):
            await _finished(store, "ann", f"k{n}")
        total = int(await store.client.get("order-test:{#budget}total") or 0)
        assert total >= 3 * ANSWER
        overtaken, _, _ = await store._count("ann", ANSWER, read_us=1)  # read long before the last keep
        assert overtaken == total
    finally:
        await store.close()
