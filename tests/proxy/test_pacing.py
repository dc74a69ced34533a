"""Paced work (:mod:`proxy.core.pacing`) of several large requests at once takes turns: a small request waits about one
slice per turn of the event loop it needs, not one slice per large request in flight."""

from __future__ import annotations

import asyncio
import time

from proxy.core.pacing import Pacer


def _busy(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def _slices_between_steps(heavy: int) -> float:
    """Slices of paced work that ran, on average, between two steps of a task that yields 20 times."""
    slices = 0
    stop = False

    async def large() -> None:
        nonlocal slices
        pacer = Pacer(slice_s=0.0005)
        while not stop:
            _busy(0.0006)  # more than a slice: every turn() yields
            slices += 1
            await pacer.turn()

    workers = [asyncio.ensure_future(large()) for _ in range(heavy)]
    await asyncio.sleep(0.01)  # every large request is under way
    before = slices
    for _ in range(20):
        await asyncio.sleep(0)
    between = (slices - before) / 20
    stop = True
    await asyncio.gather(*workers)
    return between


async def test_large_requests_take_turns() -> None:
    one, five = await _slices_between_steps(1), await _slices_between_steps(5)
    assert one <= 1.5
    assert five <= 1.5, f"{five} slices ran per turn of the loop with five large requests in flight"
