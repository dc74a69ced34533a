"""The sentinel that tells a Redis which lost its data from one that kept it (:mod:`proxy.stores.redis_wipe`),
against a real Redis."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.stores.redis_client import connect
from proxy.stores.redis_wipe import WipeWatch
from proxy.stores.unavailable import StoreUnavailable


async def test_a_sentinel_gone_or_replaced_is_a_wipe_until_it_is_back(redis_url: str) -> None:
    client = connect(redis_url)
    first, second = WipeWatch(client, key="t:sentinel"), WipeWatch(client, key="t:sentinel")
    try:
        assert not await first.check() and not await second.check()
        assert first.token == second.token, "replicas share the first one's sentinel"
        first.refuse()
        saved = await client.get("t:sentinel")
        assert saved is not None
        await client.flushall()  # what a restart without persistence leaves
        assert await first.check()
        with pytest.raises(StoreUnavailable):
            first.refuse()
        await client.set("t:sentinel", "written by a replica started later")
        assert await first.check(), "another token: still the empty Redis"
        await client.set("t:sentinel", saved)  # the data restored from a backup
        assert not await first.check()
        first.refuse()
    finally:
        await client.aclose()


async def test_a_redis_that_does_not_answer_is_not_judged() -> None:
    watch = WipeWatch(connect("redis://127.0.0.1:1/0", timeout_s=0.2), key="t:sentinel")
    assert not await watch.check()
    assert watch.token is None, "written at the first answer"


class _RedisLosingACancellation:
    """A Redis client double whose read turns the first cancellation into a timeout, as redis-py's commands can on
    Python 3.11 when their socket timeout and the cancellation meet (the replica then hung in its drain)."""

    def __init__(self) -> None:
        self.lost = 0

    async def set(self, *_: object, **__: object) -> bool:
        return True

    async def get(self, _key: str) -> bytes:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if self.lost:
                raise
            self.lost += 1
            raise RedisTimeoutError("Timeout reading from socket") from None
        return b"token"


async def test_the_watch_stops_even_when_its_client_lost_the_cancellation() -> None:
    client = _RedisLosingACancellation()
    watch = WipeWatch(client, key="t:sentinel", interval_s=0.01)
    watch.token = b"token"
    watch._task = asyncio.get_running_loop().create_task(watch._watch())
    await asyncio.sleep(0.1)  # in its read
    stopping = asyncio.create_task(watch.stop())
    done, _ = await asyncio.wait({stopping}, timeout=10)
    assert done, "stop() still waiting for a task that outlived its cancellation"
    assert client.lost == 1
