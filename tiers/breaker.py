"""A circuit breaker: stop calling a failing dependency, probe it now and then, resume when it answers.

Pure state machine with an injectable clock (no I/O): ``closed`` (calls allowed) → after ``failures_to_open``
consecutive failures ``open`` (calls refused for ``open_seconds``) → ``half_open`` (one probe call allowed) → a
success closes it, a failure opens it again. Used by every cache tier (a broken Redis or disk is skipped, and the
request goes upstream) and by every upstream replica.

Every call the breaker let through ends in :meth:`success`, :meth:`failure` or :meth:`release` (no verdict: the
caller was cancelled, or failed for a reason of its own). A probe that reports nothing at all still frees the
half-open slot after ``open_seconds``, so a lost outcome can delay recovery but never block it.
:meth:`half_open` lets an outside signal (a health check that succeeded) end the wait early.
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
        self._probe_since: float | None = None  # when the half-open probe went out (None: no probe out)
        self.opened_count = 0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_seconds:
            self._state = BreakerState.HALF_OPEN
            self._probe_since = None
        return self._state

    def allow(self) -> bool:
        """Whether a call may go ahead now (in half-open state: only the one probe)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN:
            now = self._clock()
            if self._probe_since is None or now - self._probe_since >= self.open_seconds:
                self._probe_since = now
                return True
        return False

    def success(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._probe_since = None

    def failure(self) -> None:
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN or self._failures >= self.failures_to_open:
            if self._state is not BreakerState.OPEN:
                self.opened_count += 1
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
            self._probe_since = None

    def release(self) -> None:
        """A call ended without a verdict on the dependency: if a probe was out, the next call may probe."""
        self._probe_since = None

    def half_open(self) -> None:
        """An open breaker stops waiting: the next call probes (a health check saw the dependency answer)."""
        if self._state is BreakerState.OPEN:
            self._state = BreakerState.HALF_OPEN
            self._probe_since = None
