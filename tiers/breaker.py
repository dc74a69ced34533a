"""A circuit breaker: stop calling a failing dependency, probe it now and then, resume when it answers.

Pure state machine with an injectable clock (no I/O): ``closed`` (calls allowed) → after ``failures_to_open``
consecutive failures ``open`` (calls refused for ``open_seconds``) → ``half_open`` (one probe call allowed) → a
success closes it, a failure opens it again. Used by every cache tier (a broken Redis or disk is skipped, and the
request goes upstream) and by every upstream replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Consecutive-failure breaker with a single half-open probe."""

    def __init__(self, *, failures_to_open: int = 5, open_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures_to_open = failures_to_open
        self.open_seconds = open_seconds
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False
        self.opened_count = 0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_seconds:
            self._state = BreakerState.HALF_OPEN
            self._probing = False
        return self._state

    def allow(self) -> bool:
        """Whether a call may go ahead now (in half-open state: only the one probe)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def success(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._probing = False

    def failure(self) -> None:
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN or self._failures >= self.failures_to_open:
            if self._state is not BreakerState.OPEN:
                self.opened_count += 1
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
            self._probing = False
