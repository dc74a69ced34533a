"""Several proxies in shared mode in front of the same replicas: each admits its share of a replica's slots."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from proxy.core.context import Reply, RequestContext
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue, slot_share
from proxy.kv.order import OrderPolicy
from proxy.kv.stages import Route, Shape, SharedPrefixes
from tests.proxy.kv.test_stages import ctx_for, replicas, structured
from tiers.invalidation_bus import InvalidationBus


def test_the_shares_of_a_replicas_slots_never_add_up_to_more_than_its_slots_and_are_at_least_one() -> None:
    for slots in range(1, 17):
        assert slot_share(slots, 1) == slots  # a proxy alone admits every slot, as before
        for proxies in range(2, 9):
            share = slot_share(slots, proxies)
            assert share >= 1
            assert proxies * share <= max(slots, proxies)
            assert (proxies * (share + 1) > slots) or share * proxies == slots  # no whole slot left unshared
    assert [slot_share(2, n) for n in (1, 2, 3)] == [2, 1, 1]
    assert [slot_share(8, n) for n in (0, 2, 3)] == [8, 4, 2]  # 0 members read yet: alone


async def test_a_lowered_share_caps_what_is_in_flight_and_a_raised_one_lets_waiters_in_at_once() -> None:
    queue = AdmissionQueue(2)
    assert queue.try_acquire() and queue.try_acquire()
    waiter = asyncio.create_task(queue.acquire(0, 100))
    await asyncio.sleep(0)
    queue.share(proxies=2)  # another proxy joined: one in flight for this one
    assert queue.limit == 1
    queue.release()
    await asyncio.sleep(0)
    assert not waiter.done() and queue.active == 1  # still over its share: the freed slot is not passed on
    queue.release()
    await waiter
    assert queue.active == 1
    second = asyncio.create_task(queue.acquire(0, 100))
    await asyncio.sleep(0)
    assert not second.done()
    queue.share(proxies=1)  # the other proxy left: both slots again, and the waiter goes in without a release
    await asyncio.wait_for(second, 1)
    assert queue.limit == 2 and queue.active == 2


async def test_the_servers_slots_and_the_proxies_combine() -> None:
    queue = AdmissionQueue(8)
    queue.share(proxies=3)
    assert queue.limit == 2
    queue.share(slots=4)  # the server has 4 slots (discovery): 4 // 3
    assert (queue.slots, queue.limit) == (4, 1)


class _Board:
    def record(self, backend: str, prefixes: Iterable[tuple[str, int]]) -> None:
        pass

    def cached_tokens(self, backend: str, hashes: Sequence[str]) -> int:
        return 0


async def test_route_in_shared_mode_puts_no_more_than_its_share_on_a_replica() -> None:
    """Two proxies on the bus, a replica of two slots: this proxy sends one request at a time to it, the next
    waits in its cache-aware queue (before, both went to the server, which queued one of them first come)."""
    reps, router = replicas(1)
    route = Route(reps, router)
    route.shared = SharedPrefixes(_Board(), ["r0"], lambda: 2)
    in_flight, most = 0, 0
    release = asyncio.Event()

    async def held(ctx: RequestContext) -> Reply:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await release.wait()
        in_flight -= 1
        return Reply(200, body=b'{"choices": []}')

    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.PRESERVE), route], held)
    flights = [asyncio.ensure_future(pipeline(ctx_for(structured(a, b), i))) for i, (a, b) in
               enumerate([("a", "b"), ("c", "d"), ("a", "c")])]
    await asyncio.sleep(0.05)
    assert most == 1 and reps[0].queue.waiting == 2
    release.set()
    await asyncio.gather(*flights)
    assert most == 1 and reps[0].queue.active == 0


async def test_the_bus_counts_its_live_members(redis_url: str) -> None:
    buses = [InvalidationBus(redis_url, heartbeat_s=0.05, lease_s=1.0) for _ in range(3)]
    for bus in buses:
        assert await bus.start(5)
    try:
        await asyncio.sleep(0.3)
        assert [bus.members for bus in buses] == [3, 3, 3]
        await buses.pop().stop()
        await asyncio.sleep(0.3)
        assert [bus.members for bus in buses] == [2, 2]
    finally:
        for bus in buses:
            await bus.stop()
