"""The bus's membership registry: an invalidation waits for every replica with a live lease, not only for the
receivers ``PUBLISH`` counted — so a replica whose subscription Redis already closed, unnoticed, cannot serve a
stale near copy after the call returned."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from proxy.assembly.config import load_settings
from proxy.cache_tiers.shared_mode import SharedMode, SharedOptions, build_shared
from tiers.entry import CachedResponse
from tiers.invalidation_bus import Pending

FAST = SharedOptions(bus_heartbeat_s=0.1, bus_lease_s=1.0, bus_ack_timeout_s=0.2)


def test_pending_waits_for_every_live_member_even_beyond_the_publish_count() -> None:
    pending = Pending()
    pending.ack("a")
    pending.ack("b")
    pending.expect(2, frozenset({"a", "b", "c"}))
    assert not pending.done.is_set(), "c holds a live lease: PUBLISH's count of 2 is not enough"
    assert pending.missing == ("c",)
    pending.ack("c")
    assert pending.done.is_set() and not pending.missing


async def _replicas(url: str, count: int) -> list[SharedMode]:
    replicas = []
    for _ in range(count):
        shared = build_shared(load_settings(env={}, overrides={"redis.url": url}), options=FAST)
        assert shared is not None
        await shared.start()
        replicas.append(shared)
    return replicas


def _entry() -> CachedResponse:
    return CachedResponse(body=b'{"answer": "old"}', kind="chat", model="m")


async def _members(url: str) -> set[str]:
    client = aioredis.Redis.from_url(url)
    try:
        members = await client.zrange("ragproxy:{bus}:members", 0, -1)
        return {m.decode() if isinstance(m, bytes) else str(m) for m in members}
    finally:
        await client.aclose()


async def test_every_replica_registers_and_a_stopped_one_leaves(redis_url: str) -> None:
    a, b = await _replicas(redis_url, 2)
    try:
        assert await _members(redis_url) == {a.bus.replica_id, b.bus.replica_id}
        await b.stop()
        assert await _members(redis_url) == {a.bus.replica_id}
        await a.l1.put("k", _entry(), ttl=60, tags=["all"])
        await a.l1.delete("k")
        delivery = a.near.last_delivery
        assert delivery is not None and delivery.complete and not delivery.fenced, "nobody gone is waited for"
        assert (delivery.expected, delivery.acked, delivery.missing) == (1, 1, ())
    finally:
        await a.stop()


async def test_a_replica_whose_subscription_is_gone_unnoticed_is_waited_for(redis_url: str) -> None:
    a, b, c = await _replicas(redis_url, 3)
    try:
        await a.l1.put("k", _entry(), ttl=60, tags=["all"])
        assert await c.l1.get("k") is not None
        assert c.near.near.get_nowait("k") is not None, "c holds a near copy"
        # What a half-open connection looks like from Redis: c's subscription is closed, so PUBLISH no longer
        # counts c, but c has not noticed (still connected in its own eyes, heartbeating, serving near copies).
        listener = c.bus._tasks[0]
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        assert c.bus.trusted and await c.l1.get("k") is not None

        begun = time.monotonic()
        await a.l1.delete("k")
        waited = time.monotonic() - begun
        delivery = a.near.last_delivery
        assert delivery is not None
        assert (delivery.expected, delivery.acked, delivery.complete, delivery.fenced) == (3, 2, False, True)
        assert delivery.missing == (c.bus.replica_id,)
        assert waited >= FAST.bus_lease_s, "the call waited out c's lease"
        assert not c.bus.trusted
        assert await c.l1.get("k") is None, "c serves no stale copy once the call returned"
        assert await b.l1.get("k") is None
    finally:
        for shared in (a, b, c):
            await shared.stop()
