"""Per-replica concurrency limit with a cache-aware waiting queue (RAGCache's request reordering).

:class:`CacheAwareOrder` is the pure ordering: waiting requests leave in decreasing ``cached_tokens /
compute_tokens`` (requests that reuse much and compute little go first, which raises the cache hit rate and
lowers mean latency), except that a request waiting longer than ``starvation_window_s`` goes before everything
else (oldest first), so large uncached requests are delayed by at most the window.

Deadlines: a request may carry the latest time its prefill can start and still give its first token within the
TTFT objective (the router's :attr:`~proxy.kv.router.RouteDecision.start_deadline`). One still waiting past it
is not started but dropped (:attr:`CacheAwareOrder.expired`; the adapter raises :class:`DeadlineExceeded`, a
429 for the client): it would miss the objective anyway, and the prefill it would have cost goes to requests
that can still meet theirs. Under overload this is what keeps goodput up — without it every request in a
growing queue is served late. A request leaving the queue does not start its prefill at once when the replica
still has prefill work in hand (a llama.cpp server computes its slots' prompts one after the other): with a
``backlog`` (the router's estimate of that work, :meth:`~proxy.kv.router.ReplicaLoad.running_s`) a waiting request
is dropped once ``now + backlog`` passes its deadline.

:class:`AdmissionQueue` is the thin asyncio adapter: ``async with queue.slot(cached, compute):`` waits for one
of ``limit`` slots (bounded by ``max_wait_s``; :class:`asyncio.TimeoutError` when exceeded) and frees it on
exit. ``limit`` is this proxy's share of the replica's ``slots`` (:func:`slot_share`): all of them for a proxy
alone, a part of them when several proxies in shared mode send to the same replica (docs/scale-out.md).
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

from proxy.kv.settings import RoutingSettings

_ROUTING = RoutingSettings()  # the defaults, defined once there

T = TypeVar("T")


def slot_share(slots: int, proxies: int) -> int:
    """How many of a replica's ``slots`` one of ``proxies`` proxies in front of it lets in flight: an equal part,
    rounded down so that together they do not put more on the replica than it has slots, and at least one so that
    each proxy can still send (with more proxies than slots the replica is oversubscribed by ``proxies - slots``;
    its server queues the excess first come, first served)."""
    return max(1, slots // max(1, proxies))


@dataclass(eq=False, slots=True)
class _Waiting(Generic[T]):
    item: T
    ratio: float
    enqueued_at: float
    seq: int
    deadline: float | None = None
    taken: bool = field(default=False)


class DeadlineExceeded(TimeoutError):
    """The request could not start in time to meet its TTFT objective."""


class CacheAwareOrder(Generic[T]):
    """Pure waiting-queue order: best cached/compute ratio first, starved requests before all."""

    def __init__(self, starvation_window_s: float = _ROUTING.starvation_window_s) -> None:
        self.starvation_window_s = starvation_window_s
        self.expired: list[T] = []
        """Items :meth:`pop` passed over because their deadline had gone; the caller refuses and clears them."""
        self._heap: list[tuple[float, int, _Waiting[T]]] = []
        self._arrival: deque[_Waiting[T]] = deque()
        self._seq = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(
        self, item: T, cached_tokens: int, compute_tokens: int, now: float, deadline: float | None = None
    ) -> _Waiting[T]:
        """Queue ``item``; with ``deadline``, :meth:`pop` drops it into :attr:`expired` once ``now`` passes it."""
        ratio = cached_tokens / max(1, compute_tokens)
        entry = _Waiting(item, ratio, now, next(self._seq), deadline)
        heapq.heappush(self._heap, (-ratio, entry.seq, entry))
        self._arrival.append(entry)
        self._size += 1
        return entry

    def remove(self, entry: _Waiting[T]) -> None:
        """Withdraw a waiting entry (its waiter gave up)."""
        if not entry.taken:
            entry.taken = True
            self._size -= 1

    def pop(self, now: float, backlog_s: float = 0.0) -> T | None:
        """The next request to admit, or ``None`` when nobody waits. Its prefill starts ``backlog_s`` from now: those
        whose deadline that passes go to :attr:`expired`."""
        start = now + backlog_s
        while self._arrival and (self._arrival[0].taken or self._expire(self._arrival[0], start)):
            self._arrival.popleft()
        if self._arrival and now - self._arrival[0].enqueued_at >= self.starvation_window_s:
            return self._take(self._arrival.popleft())
        while self._heap:
            _, _, entry = heapq.heappop(self._heap)
            if not entry.taken and not self._expire(entry, start):
                return self._take(entry)
        return None

    def _expire(self, entry: _Waiting[T], start: float) -> bool:
        if entry.taken or entry.deadline is None or start <= entry.deadline:
            return False
        self.expired.append(self._take(entry))
        return True

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
        starvation_window_s: float = _ROUTING.starvation_window_s,
        max_wait_s: float = _ROUTING.queue_max_wait_s,
        clock: Callable[[], float] = time.monotonic,
        backlog: Callable[[float], float] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.backlog = backlog
        """Estimated prefill seconds the replica still has in hand at a given time (its own requests in flight)."""
        self.slots = limit
        """Requests the replica takes in flight at once (configured, lowered to its server's slots when known)."""
        self.proxies = 1
        """Proxies in front of the replica, this one included (live members of the shared-mode bus)."""
        self.limit = limit
        """This proxy's share of :attr:`slots`: :func:`slot_share`."""
        self.max_wait_s = max_wait_s
        self.active = 0
        self._order: CacheAwareOrder[asyncio.Future[None]] = CacheAwareOrder(starvation_window_s)
        self._clock = clock

    @property
    def waiting(self) -> int:
        return len(self._order)

    def try_acquire(self) -> bool:
        """Take a free slot at once if nobody waits for one (no coroutine: the common case)."""
        if self.active < self.limit and not len(self._order):
            self.active += 1
            return True
        return False

    async def acquire(self, cached_tokens: int, compute_tokens: int, deadline: float | None = None) -> None:
        """Wait for a slot; :class:`DeadlineExceeded` when ``deadline`` (this queue's clock) passes first,
        :class:`TimeoutError` after ``max_wait_s``."""
        now = self._clock()
        if self.active < self.limit and not len(self._order):
            self.active += 1
            return
        if deadline is not None and deadline < now:
            raise DeadlineExceeded("the request cannot start before its deadline")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._order.push(future, cached_tokens, compute_tokens, now, deadline)
        wait_s = self.max_wait_s if deadline is None else min(self.max_wait_s, deadline - now)
        try:
            async with asyncio.timeout(wait_s):
                await future
        except TimeoutError as error:
            self._give_up(future, entry)
            if isinstance(error, DeadlineExceeded) or (deadline is not None and deadline - now <= self.max_wait_s):
                raise DeadlineExceeded("the request could not start before its deadline") from None
            raise
        except BaseException:
            self._give_up(future, entry)
            raise

    def _give_up(self, future: asyncio.Future[None], entry: _Waiting[asyncio.Future[None]]) -> None:
        if future.done() and not future.cancelled() and future.exception() is None:
            self.release()  # the slot was handed over just as we gave up
        elif not future.done():
            future.cancel()
        self._order.remove(entry)

    def share(self, *, slots: int | None = None, proxies: int | None = None) -> None:
        """Follow a new number of the replica's ``slots`` or of ``proxies`` in front of it: :attr:`limit` becomes
        :func:`slot_share` of them. A raised limit lets waiters in at once; a lowered one takes effect as requests
        in flight finish."""
        if slots is not None:
            if slots < 1:
                raise ValueError("slots must be at least 1")
            self.slots = slots
        if proxies is not None:
            self.proxies = proxies
        self.limit = slot_share(self.slots, self.proxies)
        while self.active < self.limit and len(self._order):
            self.active += 1
            if not self._hand_over():
                self.active -= 1
                return

    def release(self) -> None:
        if not len(self._order) or self.active > self.limit:  # nobody waits (the common case), or over the limit
            self.active = max(0, self.active - 1)
            return
        if not self._hand_over():
            self.active = max(0, self.active - 1)

    def _hand_over(self) -> bool:
        """Pass a slot to the next waiter that can still start in time; ``False`` when none is left."""
        while True:
            now = self._clock()
            future = self._order.pop(now, self.backlog(now) if self.backlog is not None else 0.0)
            for late in self._order.expired:
                if not late.done():
                    late.set_exception(DeadlineExceeded("the request could not start before its deadline"))
            self._order.expired.clear()
            if future is None:
                return False
            if not future.done():
                future.set_result(None)  # the slot passes to the waiter
                return True

    @asynccontextmanager
    async def slot(
        self, cached_tokens: int, compute_tokens: int, deadline: float | None = None
    ) -> AsyncIterator[None]:
        await self.acquire(cached_tokens, compute_tokens, deadline)
        try:
            yield
        finally:
            self.release()
