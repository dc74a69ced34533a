"""Per-replica concurrency limit with a cache-aware waiting queue (RAGCache's request reordering).

:class:`CacheAwareOrder` is the pure ordering: waiting requests leave in decreasing ``cached_tokens /
compute_tokens`` (requests that reuse much and compute little go first, which raises the cache hit rate and
lowers mean latency), except that a request waiting longer than ``starvation_window_s`` goes before everything
else (oldest first), so large uncached requests are delayed by at most the window.

:class:`AdmissionQueue` is the thin asyncio adapter: ``async with queue.slot(cached, compute):`` waits for one
of ``limit`` slots (bounded by ``max_wait_s``; :class:`asyncio.TimeoutError` when exceeded) and frees it on
exit.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class _Waiting(Generic[T]):
    item: T
    ratio: float
    enqueued_at: float
    seq: int
    taken: bool = field(default=False)


class CacheAwareOrder(Generic[T]):
    """Pure waiting-queue order: best cached/compute ratio first, starved requests before all."""

    def __init__(self, starvation_window_s: float = 2.0) -> None:
        self.starvation_window_s = starvation_window_s
        self._heap: list[tuple[float, int, _Waiting[T]]] = []
        self._arrival: deque[_Waiting[T]] = deque()
        self._seq = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: T, cached_tokens: int, compute_tokens: int, now: float) -> _Waiting[T]:
        ratio = cached_tokens / max(1, compute_tokens)
        entry = _Waiting(item, ratio, now, next(self._seq))
        heapq.heappush(self._heap, (-ratio, entry.seq, entry))
        self._arrival.append(entry)
        self._size += 1
        return entry

    def remove(self, entry: _Waiting[T]) -> None:
        """Withdraw a waiting entry (its waiter gave up)."""
        if not entry.taken:
            entry.taken = True
            self._size -= 1

    def pop(self, now: float) -> T | None:
        """The next request to admit, or ``None`` when nobody waits."""
        while self._arrival and self._arrival[0].taken:
            self._arrival.popleft()
        if self._arrival and now - self._arrival[0].enqueued_at >= self.starvation_window_s:
            return self._take(self._arrival.popleft())
        while self._heap:
            _, _, entry = heapq.heappop(self._heap)
            if not entry.taken:
                return self._take(entry)
        return None

    def _take(self, entry: _Waiting[T]) -> T:
        entry.taken = True
        self._size -= 1
        return entry.item


class AdmissionQueue:
    """At most ``limit`` requests in flight on one replica; the rest wait in cache-aware order."""

    def __init__(
        self,
        limit: int = 4,
        *,
        starvation_window_s: float = 2.0,
        max_wait_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.max_wait_s = max_wait_s
        self.active = 0
        self._order: CacheAwareOrder[asyncio.Future[None]] = CacheAwareOrder(starvation_window_s)
        self._clock = clock

    @property
    def waiting(self) -> int:
        return len(self._order)

    async def acquire(self, cached_tokens: int, compute_tokens: int) -> None:
        if self.active < self.limit and not len(self._order):
            self.active += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._order.push(future, cached_tokens, compute_tokens, self._clock())
        try:
            async with asyncio.timeout(self.max_wait_s):
                await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed over just as we gave up
            else:
                future.cancel()
                self._order.remove(entry)
            raise

    def release(self) -> None:
        while True:
            future = self._order.pop(self._clock())
            if future is None:
                self.active = max(0, self.active - 1)
                return
            if not future.done():
                future.set_result(None)  # the slot passes to the waiter; active stays the same
                return

    @asynccontextmanager
    async def slot(self, cached_tokens: int, compute_tokens: int) -> AsyncIterator[None]:
        await self.acquire(cached_tokens, compute_tokens)
        try:
            yield
        finally:
            self.release()
