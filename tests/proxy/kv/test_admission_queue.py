"""Cache-aware waiting queue: ratio order, starvation window, asyncio concurrency limit."""

from __future__ import annotations

import asyncio

import pytest

from proxy.kv.admission_queue import AdmissionQueue, CacheAwareOrder


def test_pure_order_prefers_high_cached_to_compute_ratio() -> None:
    order: CacheAwareOrder[str] = CacheAwareOrder(starvation_window_s=10)
    order.push("cold", 0, 3000, now=0)
    order.push("warm", 2000, 1000, now=1)
    order.push("hot", 2900, 100, now=2)
    assert [order.pop(3), order.pop(3), order.pop(3), order.pop(3)] == ["hot", "warm", "cold", None]


def test_pure_order_lets_starved_requests_go_first_oldest_first() -> None:
    order: CacheAwareOrder[str] = CacheAwareOrder(starvation_window_s=5)
    order.push("cold1", 0, 3000, now=0)
    order.push("cold2", 0, 3000, now=1)
    order.push("hot", 2900, 100, now=4)
    assert order.pop(5.5) == "cold1"
    assert order.pop(5.5) == "hot"  # cold2 has waited 4.5 s only
    order.push("hot2", 2900, 100, now=5.5)
    assert order.pop(6.5) == "cold2"  # starved by now
    assert order.pop(6.5) == "hot2"


def test_removed_entries_are_skipped() -> None:
    order: CacheAwareOrder[str] = CacheAwareOrder()
    entry = order.push("gone", 100, 1, now=0)
    order.push("kept", 0, 100, now=0)
    order.remove(entry)
    assert len(order) == 1
    assert order.pop(0) == "kept" and order.pop(0) is None


async def test_limit_holds_and_waiters_leave_in_cache_aware_order() -> None:
    queue = AdmissionQueue(limit=1, starvation_window_s=100)
    await queue.acquire(0, 1)
    admitted: list[str] = []

    async def wait(name: str, cached: int, compute: int) -> None:
        await queue.acquire(cached, compute)
        admitted.append(name)

    tasks = [asyncio.create_task(wait("cold", 0, 1000)), asyncio.create_task(wait("hot", 900, 100))]
    await asyncio.sleep(0)
    assert queue.waiting == 2 and admitted == []
    queue.release()
    for _ in range(5):
        await asyncio.sleep(0)
    assert admitted == ["hot"]
    queue.release()
    await asyncio.gather(*tasks)
    assert admitted == ["hot", "cold"] and queue.active == 1
    queue.release()
    assert queue.active == 0


async def test_a_bounded_wait_times_out_and_leaves_the_queue() -> None:
    queue = AdmissionQueue(limit=1, max_wait_s=0.01)
    async with queue.slot(0, 1):
        with pytest.raises(asyncio.TimeoutError):
            await queue.acquire(0, 1)
        assert queue.waiting == 0
    assert queue.active == 0


async def test_try_acquire_takes_only_a_free_slot_nobody_waits_for() -> None:
    queue = AdmissionQueue(limit=1)
    assert queue.try_acquire() and queue.active == 1
    assert not queue.try_acquire()
    waiter = asyncio.ensure_future(queue.acquire(0, 10))
    await asyncio.sleep(0)
    queue.release()  # handed to the waiter, not left for a newcomer
    await waiter
    assert not queue.try_acquire() and queue.active == 1
    queue.release()
    assert queue.try_acquire()
