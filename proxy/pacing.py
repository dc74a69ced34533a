"""Long CPU work on the event loop, in slices: every other request keeps being served while one request's thousands
of items are keyed, looked up, stored and reassembled.

A loop over a request's items calls :meth:`Pacer.turn` after each item; the pacer gives the event loop a turn
(``asyncio.sleep(0)``) once ``slice_s`` of work has run since the last one, so no other request — a health probe
included — waits much longer than one slice per event-loop turn it needs. Pure work written as
:data:`normalizer.steps.Steps` runs the same way through :func:`finish`.

Why slices and not a worker thread: the work is Python, which holds the interpreter lock; the event loop would
then wait up to the interpreter's switch interval (5 ms) each time it takes the lock back, that is several times
per request it serves. Single C calls (parsing a large JSON body) are not split; the limits keep them to tens of
milliseconds (:mod:`normalizer.limits`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

from normalizer.steps import Steps

T = TypeVar("T")

SLICE_S = 0.0005
"""Work between two turns of the event loop: about what answering one small request takes."""


class Pacer:
    """Gives the event loop a turn whenever ``slice_s`` of work ran since the last one."""

    __slots__ = ("_since", "slice_s")

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self._since = time.perf_counter()

    async def turn(self) -> None:
        if time.perf_counter() - self._since >= self.slice_s:
            await asyncio.sleep(0)
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
