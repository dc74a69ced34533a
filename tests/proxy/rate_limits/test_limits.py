"""The decisions of rate limits and budgets (pure), and their counters: in process (with budgets in SQLite) and in
a real Redis, where concurrent takes from many clients never let more through than the limit."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.auth.keys import limits_from, limits_json
from proxy.core.handoffs import Limits, Scope
from proxy.credits.pricing import PriceBook
from proxy.rate_limits.counters import LimitCounters, LocalLimitCounters, RedisLimitCounters
from proxy.rate_limits.decisions import (
    Counted,
    Level,
    arrival_tokens,
    budget_window,
    check_duration,
    duration_seconds,
    go_duration,
    rate_headers,
    wait_s,
)
from proxy.stores.redis_client import connect


def _utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (0.0004, "1ms"), (0.02, "20ms"), (1, "1s"), (1.5, "1.5s"), (59.9986, "59.999s"), (59.9994, "1m0s"),
    (60, "1m0s"), (360, "6m0s"), (3723, "1h2m3s"), (20.0001, "20.001s")])
def test_resets_are_written_as_go_durations_like_openai_s(seconds: float, shown: str) -> None:
    assert go_duration(seconds) == shown


def test_budget_windows_are_fixed_and_aligned_in_utc() -> None:
    noon = _utc(2026, 3, 15, 12, 30)
    assert budget_window("1d", noon) == budget_window("1d", _utc(2026, 3, 15)) \
        and budget_window("1d", noon).start == _utc(2026, 3, 15) and budget_window("1d", noon).end == _utc(2026, 3, 16)
    month = budget_window("1mo", noon)
    assert (month.start, month.end) == (_utc(2026, 3, 1), _utc(2026, 4, 1))
    quarter = budget_window("3mo", noon)
    assert (quarter.start, quarter.end) == (_utc(2026, 1, 1), _utc(2026, 4, 1))
    december = budget_window("1mo", _utc(2026, 12, 31, 23, 59))
    assert (december.start, december.end) == (_utc(2026, 12, 1), _utc(2027, 1, 1))
    assert budget_window("10s", 1_000_007.5).start == 1_000_000 and budget_window("1h", noon).start == _utc(
        2026, 3, 15, 12)
    forever = budget_window(None, noon)
    assert forever.start == 0 and forever.end == float("inf")


@given(st.floats(min_value=0, max_value=4e9), st.sampled_from(["7s", "1m", "2h", "1d", "1mo", "2mo", "12mo"]))
def test_a_moment_lies_in_its_window(now: float, duration: str) -> None:
    window = budget_window(duration, now)
    assert window.start <= now < window.end
    assert budget_window(duration, window.start) == window and budget_window(duration, window.end).start == window.end


def test_durations() -> None:
    for bad in ("", "0d", "1y", "1.5d", "-1d", "10000d", "1 d", "d"):
        with pytest.raises(ValueError):
            check_duration(bad)
    assert duration_seconds("2h", 0) == 7200
    assert duration_seconds("1mo", _utc(2026, 1, 31)) == _utc(2026, 2, 28) - _utc(2026, 1, 31)


def test_limits_round_trip_as_stored() -> None:
    limits = Limits(rpm_limit=5, max_budget=1_000_000, budget_duration="1d")
    assert limits_json(limits) == {"rpm_limit": 5, "max_budget": 1_000_000, "budget_duration": "1d"}
    assert limits_from(limits_json(limits)) == limits
    assert limits_from(None) == Limits() and limits_from({"rpm_limit": True, "tpm_limit": "5"}) == Limits()


def test_arrival_tokens_are_the_prompt_estimate_and_the_output_asked_for() -> None:
    prices = PriceBook()
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50, "n": 2}
    assert arrival_tokens(body, prices) == (400 + len("user")) // 4 + 50 * 2
    assert arrival_tokens({"model": "m", "input": "y" * 40, "max_output_tokens": 10}, prices) == 10 + 10
    assert arrival_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, prices) == 2  # "userhi"
    assert arrival_tokens({"collection": "c", "vector": [1.0]}, prices) == 0
    assert arrival_tokens(None, prices) == 0


def test_headers_describe_the_scope_with_the_least_room() -> None:
    key = Scope("key", "k", Limits(rpm_limit=10, tpm_limit=1000))
    user = Scope("user", "u", Limits(rpm_limit=4))
    headers = rate_headers([Counted(key, Level(3, 600)), Counted(user, Level(3, 0))])
    assert headers == {"x-ratelimit-limit-requests": "4", "x-ratelimit-remaining-requests": "1",
                       "x-ratelimit-reset-requests": "45s", "x-ratelimit-limit-tokens": "1000",
                       "x-ratelimit-remaining-tokens": "400", "x-ratelimit-reset-tokens": "36s"}
    assert rate_headers([Counted(Scope("user", "u", Limits(max_budget=5)), Level())]) == {}


def test_waits() -> None:
    limits = Limits(rpm_limit=60, tpm_limit=600)
    assert wait_s(Level(60, 0), limits, 0) == pytest.approx(1.0)
    assert wait_s(Level(0, 590), limits, 20) == pytest.approx(1.0)
    assert wait_s(Level(0, 0), limits, 601) == float("inf")
    assert wait_s(Level(10, 10), limits, 10) == 0


SCOPE = Scope("key", "k1", Limits(rpm_limit=3, tpm_limit=100))


async def _exercise(counters: LimitCounters, now: float) -> None:
    assert [(await counters.take(SCOPE, 10, now))[0] for _ in range(4)] == [True, True, True, False]
    ok, level = await counters.take(SCOPE, 10, now)
    assert not ok and level == Level(3, 30)
    ok, level = await counters.take(SCOPE, 10, now + 20)  # 1 request and 33.3 tokens drained in 20 s
    assert ok and level == Level(pytest.approx(3), pytest.approx(10))  # type: ignore[arg-type]
    await counters.adjust(SCOPE, 0, -40, now + 20)  # settled below the estimate: never below 0
    assert await counters.level(SCOPE, now + 20) == Level(pytest.approx(3), 0)  # type: ignore[arg-type]
    assert await counters.level(SCOPE, now + 200) == Level(0, 0), "empty after a quiet minute"
    window = budget_window("1d", now)
    assert await counters.spent(SCOPE, window) == 0
    await counters.spend(SCOPE, window, 7)
    await counters.spend(SCOPE, window, 5)
    assert await counters.spent(SCOPE, window) == 12
    assert await counters.spent(SCOPE, budget_window("1d", now + 86_400)) == 0


NOW = 1_900_000_000.0


async def test_local_counters(tmp_path: Path) -> None:
    counters = LocalLimitCounters(tmp_path / "credits.sqlite3")
    try:
        await _exercise(counters, NOW)
    finally:
        await counters.close()
    reopened = LocalLimitCounters(tmp_path / "credits.sqlite3")
    try:
        assert await reopened.spent(SCOPE, budget_window("1d", NOW)) == 12, "a restart keeps the spend"
        assert await reopened.level(SCOPE, NOW) == Level(), "buckets are this process's"
    finally:
        await reopened.close()


async def test_redis_counters(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        await _exercise(RedisLimitCounters(client), time.time())
    finally:
        await client.aclose()


async def test_concurrent_takes_from_many_replicas_never_pass_the_limit(redis_url: str) -> None:
    clients = [connect(redis_url, timeout_s=15.0) for _ in range(4)]  # a loaded machine: no fallback
    scope = Scope("user", "flood{ing}: user", Limits(rpm_limit=25))
    try:
        replicas = [RedisLimitCounters(client) for client in clients]
        results = await asyncio.gather(*(replicas[n % 4].take(scope, 0, 2_000_000.0) for n in range(200)))
        assert sum(ok for ok, _ in results) == 25
    finally:
        for client in clients:
            await client.aclose()


async def test_redis_counters_fall_back_to_this_replica_when_redis_is_gone() -> None:
    from tests.support.processes import refused_port

    client = connect(f"redis://127.0.0.1:{refused_port()}/0", timeout_s=0.5)
    try:
        counters = RedisLimitCounters(client)
        assert [(await counters.take(SCOPE, 0, 5.0))[0] for _ in range(4)] == [True, True, True, False]
    finally:
        await client.aclose()


async def test_local_counters_hold_at_most_max_scopes() -> None:
    counters = LocalLimitCounters(max_scopes=10)
    window = budget_window("1d", NOW)
    for n in range(100):
        scope = Scope("key", f"k{n}", Limits(rpm_limit=5, max_budget=10))
        assert (await counters.take(scope, 0, NOW))[0]
        await counters.spend(scope, window, 1)
    assert len(counters._buckets._levels) == 10 and len(counters._spent) == 10
    quiet = Scope("user", "quiet", Limits(rpm_limit=60))
    await counters.take(quiet, 0, NOW)
    await counters.adjust(quiet, 0, 0, NOW + 2)  # drained empty: nothing kept for it
    assert "user:quiet" not in counters._buckets._levels
