"""A shared (Redis) response tier fails open: Redis killed, stalled past the op timeout, or restarted empty.

Each test owns a dedicated redis-server (it gets killed or stalled), started with ``--enable-debug-command`` so a
test can stall it with ``DEBUG SLEEP``. The tier under test is :class:`tiers.response_tier.ResponseTier` over
:class:`tiers.redis_store.RedisStore`, the pair shared mode uses for its cache tiers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from tests.support.processes import RedisServer
from tiers.breaker import BreakerState, CircuitBreaker
from tiers.entry import CachedResponse
from tiers.redis_store import RedisStore
from tiers.response_tier import ResponseTier

FAILURES_TO_OPEN = 3
OPEN_S = 0.3
# Longer than any machine's uptime: the first failure must still be logged, and only that one.
LOG_INTERVAL_S = 1e9


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer.start(None, "--enable-debug-command", "yes")
    yield server
    server.stop()


@pytest.fixture
async def tier(own_redis: RedisServer) -> AsyncIterator[ResponseTier]:
    store = RedisStore(own_redis.url, prefix="rel", timeout=0.5)
    tier = ResponseTier("shared", store, op_timeout=0.3, log_interval=LOG_INTERVAL_S,
                        breaker=CircuitBreaker(failures_to_open=FAILURES_TO_OPEN, open_seconds=OPEN_S))
    yield tier
    await store.close()


def _entry(text: str) -> CachedResponse:
    return CachedResponse(body=b'{"answer": "%s"}' % text.encode(), kind="chat")


def _tier_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ragproxy.tiers" and r.levelno >= logging.WARNING]


async def _until_closed(tier: ResponseTier, key: str, rounds: int = 100) -> CachedResponse | None:
    """Probe the tier like requests would, until the breaker lets a call through and it succeeds."""
    for _ in range(rounds):
        await asyncio.sleep(OPEN_S / 3)
        entry = await tier.get(key)
        if tier.breaker.state is BreakerState.CLOSED:
            return entry
    raise AssertionError("the breaker never closed after the dependency came back")


async def test_redis_killed_fails_open_then_recovers_by_itself(
        own_redis: RedisServer, tier: ResponseTier, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ragproxy.tiers")
    assert await tier.put("k", _entry("before"), ttl=60, tags=["all"])
    before = await tier.get("k")
    assert before is not None and before.body == _entry("before").body
    port = own_redis.port
    own_redis.process.kill()
    own_redis.process.wait()

    for _ in range(20):  # every lookup is a miss, none raises
        assert await tier.get("k") is None
        assert await tier.put("k2", _entry("x"), ttl=60, tags=[]) is False
    assert tier.breaker.state is BreakerState.OPEN
    assert tier.counters.errors == FAILURES_TO_OPEN, "past the breaker the store is not called at all"
    assert tier.counters.skipped >= 40 - FAILURES_TO_OPEN - 1
    assert len(_tier_warnings(caplog)) <= 1, "a dead dependency is logged once per interval, not per request"

    restarted = RedisServer.start(port, "--enable-debug-command", "yes")
    try:
        assert await _until_closed(tier, "k") is None  # restarted empty: a miss, not an error
        assert await tier.put("k", _entry("after"), ttl=60, tags=["all"])
        again = await tier.get("k")
        assert again is not None and again.body == _entry("after").body
    finally:
        restarted.stop()


async def test_stalled_redis_is_bounded_by_the_op_timeout_and_answers_stay_correct(
        own_redis: RedisServer, tier: ResponseTier) -> None:
    for name in ("a", "b", "c"):
        assert await tier.put(name, _entry(name), ttl=60, tags=[])
    stall = threading.Thread(target=lambda: redis.Redis(port=own_redis.port).execute_command("DEBUG", "SLEEP", 3))
    stall.start()
    await asyncio.sleep(0.1)
    assert await tier.get("a") is None  # timed out: a miss
    assert stall.is_alive(), "the lookup must give up long before the stalled Redis answers"
    assert tier.counters.errors == 1
    await asyncio.to_thread(stall.join)
    # After a cancelled command the connection must not hand one request's reply to the next (response mix-up).
    entries = [await _until_closed(tier, name) for name in ("a", "b", "c")]
    assert [e.body if e else None for e in entries] == [_entry(n).body for n in ("a", "b", "c")]


async def test_breaker_half_open_probe_fails_again_while_redis_stays_down(
        own_redis: RedisServer, tier: ResponseTier) -> None:
    own_redis.process.kill()
    own_redis.process.wait()
    for _ in range(FAILURES_TO_OPEN):
        assert await tier.get("k") is None
    assert tier.breaker.state is BreakerState.OPEN
    opened = tier.breaker.opened_count
    await asyncio.sleep(OPEN_S * 1.5)
    assert await tier.get("k") is None  # the one half-open probe, failing
    assert tier.breaker.state is BreakerState.OPEN and tier.breaker.opened_count == opened + 1
    assert tier.counters.errors == FAILURES_TO_OPEN + 1


async def test_first_failure_is_logged_then_silent_for_the_interval(
        own_redis: RedisServer, tier: ResponseTier, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ragproxy.tiers")
    own_redis.process.kill()
    own_redis.process.wait()
    for _ in range(10):
        assert await tier.get("k") is None
    assert len(_tier_warnings(caplog)) == 1


async def test_a_cancelled_half_open_probe_does_not_keep_the_tier_off(
        own_redis: RedisServer, tier: ResponseTier) -> None:
    """The one probe after an outage is cancelled (its client hung up): the next lookup may probe again."""
    assert await tier.put("k", _entry("kept"), ttl=60, tags=[])
    stall = threading.Thread(target=lambda: redis.Redis(port=own_redis.port).execute_command("DEBUG", "SLEEP", 2))
    stall.start()
    await asyncio.sleep(0.1)
    for _ in range(FAILURES_TO_OPEN):  # each times out: the breaker opens
        assert await tier.get("k") is None
    assert tier.breaker.state is BreakerState.OPEN
    await asyncio.sleep(OPEN_S * 1.2)
    probe = asyncio.create_task(tier.get("k"))  # the half-open probe, stuck behind the stalled Redis
    await asyncio.sleep(0.1)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    await asyncio.to_thread(stall.join)
    entry = await _until_closed(tier, "k")
    assert entry is not None and entry.body == _entry("kept").body
