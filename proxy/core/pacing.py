"""Long CPU work on the event loop, in slices: every other request keeps being served while one request's thousands
of items are keyed, looked up, stored and reassembled.

A loop over a request's items calls :meth:`Pacer.turn` after each item; the pacer gives the event loop a turn
(``asyncio.sleep(0)``) once ``slice_s`` of work has run since the last one, so no other request — a health probe
included — waits much longer than one slice per event-loop turn it needs. Pure work written as
:data:`normalizer.steps.Steps` runs the same way through :func:`finish`.

Several such requests at once take turns: after its slice, a request's work waits for its place in one
first-come queue per event loop (:class:`_Lane`), which lets one slice run per turn of the loop, so a small request
is delayed by about one slice per turn it needs, not by one slice per large request in flight.

Why slices and not a worker thread: the work is Python, which holds the interpreter lock; the event loop would
then wait up to the interpreter's switch interval (5 ms) each time it takes the lock back, that is several times
per request it serves. Single C calls (parsing a large JSON body) are not split; the limits keep them to tens of
milliseconds (:mod:`normalizer.limits`).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from typing import TypeVar

from normalizer.steps import Steps

T = TypeVar("T")

SLICE_S = 0.0005
"""Work between two turns of the event loop: about what answering one small request takes."""


class _Lane:
    """One slice of paced work per turn of an event loop, first come, first served."""

    __slots__ = ("_loop", "_taken", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._taken = False
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def wait_turn(self) -> None:
        if self._taken:
            waiter = self._loop.create_future()
            self._waiting.append(waiter)
            await waiter  # given by _pass_on, which keeps the lane taken for this turn
            return
        self._taken = True
        self._loop.call_soon(self._pass_on)

    def _pass_on(self) -> None:
        """At the next turn of the loop: the lane to the first waiter still waiting, or free."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._loop.call_soon(self._pass_on)
                return
        self._taken = False


_LANES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane] = weakref.WeakKeyDictionary()


def _lane() -> _Lane:
    loop = asyncio.get_running_loop()
    lane = _LANES.get(loop)
    if lane is None:
        lane = _LANES[loop] = _Lane(loop)
    return lane


class Pacer:
    """Gives the event loop a turn whenever ``slice_s`` of work ran since the last one, then waits for this work's
    turn behind other paced work (see the module docstring)."""

    __slots__ = ("_since", "slice_s")

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self._since = time.perf_counter()

    async def turn(self) -> None:
        if time.perf_counter() - self._since >= self.slice_s:
            await asyncio.sleep(0)
            await _lane().wait_turn()
            self._since = time.perf_counter()


async def finish(steps: Steps[T], pacer: Pacer | None = None) -> T:
    """The result of ``steps``, with a turn of the event loop whenever a slice of them has run."""
    pacer = pacer or Pacer()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await pacer.turn()
