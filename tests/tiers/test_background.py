"""stop_task: a background task stops even when a library lost the first cancellation."""

from __future__ import annotations

import asyncio

from tiers.background import stop_task


async def _loses_one_cancellation(woken: list[str]) -> None:
    """A periodic loop around a call that turns a cancellation into a timeout and retries, as redis-py's commands can
    on Python 3.11."""
    while True:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            woken.append("cancelled")
            if len(woken) == 1:
                continue  # lost inside the library: the loop goes on
            raise


async def test_a_task_that_lost_its_cancellation_is_cancelled_again_until_it_ends() -> None:
    woken: list[str] = []
    task = asyncio.create_task(_loses_one_cancellation(woken))
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_task(task), timeout=10)
    assert task.cancelled() and woken == ["cancelled", "cancelled"]


async def test_a_finished_or_failed_task_is_consumed_without_raising() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await stop_task(task)
    await stop_task(None)
    assert isinstance(task.exception(), ValueError)
