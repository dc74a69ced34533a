"""Stopping a background task for certain.

A cancellation can be lost inside a library: on Python 3.11 a timeout that expires together with the cancellation
turns it into a ``TimeoutError``, which a client's retry loop then handles as a slow reply (redis-py's commands
run inside such timeouts), and the task goes on to its next wait as if never cancelled. A stop that cancels once and
awaits the task then waits forever: a replica asked to stop hung in its drain. :func:`stop_task` cancels again
until the task has ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_S = 0.5
"""How long a cancelled task is waited for before it is cancelled again."""


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) until it has ended; what it ended with (its result, an exception, the cancellation)
    is consumed, never raised."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_S)
    if not task.cancelled():
        task.exception()  # retrieved: never reported as "exception was never retrieved"
