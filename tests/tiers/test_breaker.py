"""The circuit breaker's state machine under an injected clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tiers.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_then_probes_and_closes() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=3, open_seconds=10, clock=clock)
    for _ in range(2):
        breaker.failure()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    breaker.failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now = 10
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow(), "one probe"
    assert not breaker.allow(), "only one probe at a time"
    breaker.success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()


def test_failed_probe_reopens() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=1, open_seconds=1, clock=clock)
    breaker.failure()
    clock.now = 1
    assert breaker.allow()
    breaker.failure()
    assert breaker.state is BreakerState.OPEN
    clock.now = 1.5
    assert not breaker.allow()
    assert breaker.opened_count == 2


def test_success_resets_the_count() -> None:
    breaker = CircuitBreaker(failures_to_open=2, clock=Clock())
    breaker.failure()
    breaker.success()
    breaker.failure()
    assert breaker.state is BreakerState.CLOSED


@given(st.lists(st.sampled_from(["ok", "fail", "tick"]), max_size=60))
def test_never_allows_while_open_before_the_timeout(events: list[str]) -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=2, open_seconds=3, clock=clock)
    for event in events:
        if event == "tick":
            clock.now += 1
        elif breaker.allow():
            breaker.success() if event == "ok" else breaker.failure()
        if breaker._state is BreakerState.OPEN and clock.now - breaker._opened_at < 3:
            assert not breaker.allow()


def half_open(open_seconds: float) -> tuple[Clock, CircuitBreaker]:
    """A breaker opened by one failure, ``open_seconds`` ago: half-open, its probe not yet taken."""
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=1, open_seconds=open_seconds, clock=clock)
    breaker.failure()
    clock.now = open_seconds
    return clock, breaker


def test_a_probe_that_ends_without_a_verdict_lets_the_next_call_probe() -> None:
    _, breaker = half_open(5)
    assert breaker.allow() and not breaker.allow()
    breaker.release()  # the probe's caller was cancelled
    assert breaker.allow(), "a cancelled probe does not keep the breaker half-open forever"
    breaker.success()
    assert breaker.state is BreakerState.CLOSED


def test_a_probe_that_never_reports_frees_its_slot_after_open_seconds() -> None:
    clock, breaker = half_open(5)
    assert breaker.allow()
    clock.now = 9.9
    assert not breaker.allow()
    clock.now = 10
    assert breaker.allow()


def test_half_open_ends_the_wait_of_an_open_breaker_only() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=1, open_seconds=60, clock=clock)
    breaker.half_open()
    assert breaker.state is BreakerState.CLOSED
    breaker.failure()
    assert not breaker.allow()
    breaker.half_open()  # a health check saw the dependency answer
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allow() and not breaker.allow()
