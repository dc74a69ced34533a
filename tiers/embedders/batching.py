"""Micro-batching: concurrent ``embed`` calls share one model (or HTTP) call.

Requests queue up; one drain task takes up to ``max_batch`` texts (whole requests, never split), waits at
most ``max_wait_s`` for more when the batch is not yet full, makes one call to ``run_batch`` with the
distinct texts, and hands each caller its rows. Only one batch is in flight at a time, so requests that
arrive while the model is busy form the next batch by themselves.

Default ``max_wait_s = 0``: the batch closes after one event-loop turn. Waiting longer would add that delay
to every lone request (the common case for a cache lookup), while under load batches already form from the
requests that arrive during the previous call. Raise it (1-2 ms) for a throughput-bound backend such as a
remote API billed per request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from tiers.background import stop_task
from tiers.embedders.base import FloatArray

BatchFunction = Callable[[list[str]], Awaitable[FloatArray]]


@dataclass(slots=True)
class _Request:
    texts: list[str]
    future: asyncio.Future[FloatArray]


class MicroBatcher:
    """Collects concurrent requests into batches for ``run_batch``."""

    def __init__(self, run_batch: BatchFunction, *, max_batch: int = 32, max_wait_s: float = 0.0) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_s must not be negative")
        self._run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._queue: deque[_Request] = deque()
        self._queued_texts = 0
        self._full = asyncio.Event()
        self._drain: asyncio.Task[None] | None = None
        self.batches = 0
        """Number of calls made to ``run_batch`` (for metrics and tests)."""

    async def embed(self, texts: list[str]) -> FloatArray:
        """Rows for ``texts``, computed in a batch shared with concurrent callers."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        future: asyncio.Future[FloatArray] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(texts), future))
        self._queued_texts += len(texts)
        if self._queued_texts >= self.max_batch:
            self._full.set()
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._drain_queue())
        return await future

    async def close(self) -> None:
        """Stop the drain task; queued callers get ``CancelledError``."""
        if self._drain is not None:
            await stop_task(self._drain)
        while self._queue:
            self._queue.popleft().future.cancel()
        self._queued_texts = 0

    async def _drain_queue(self) -> None:
        while self._queue:
            await self._gather_window()
            batch = self._take_batch()
            if batch:
                await self._run(batch)

    async def _gather_window(self) -> None:
        if self._queued_texts >= self.max_batch:
            return
        if self.max_wait_s <= 0:
            await asyncio.sleep(0)
            return
        self._full.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._full.wait(), self.max_wait_s)

    def _take_batch(self) -> list[_Request]:
        batch: list[_Request] = []
        size = 0
        while self._queue and (not batch or size + len(self._queue[0].texts) <= self.max_batch):
            request = self._queue.popleft()
            self._queued_texts -= len(request.texts)
            if request.future.cancelled():
                continue
            batch.append(request)
            size += len(request.texts)
        if self._queued_texts < self.max_batch:
            self._full.clear()
        return batch

    async def _run(self, batch: list[_Request]) -> None:
        distinct = list(dict.fromkeys(text for request in batch for text in request.texts))
        self.batches += 1
        try:
            rows = await self._run_batch(distinct)
        except asyncio.CancelledError:
            for request in batch:
                request.future.cancel()
            raise
        except Exception as error:  # every caller of the batch sees the backend's failure
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(error)
            return
        position = {text: index for index, text in enumerate(distinct)}
        for request in batch:
            if not request.future.done():
                request.future.set_result(rows[[position[text] for text in request.texts]])
