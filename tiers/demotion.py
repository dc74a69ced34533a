"""Background demotion: entries pushed out of L1/L2 move into L3 without slowing a request.

``Demoter.offer`` has the signature of :class:`tiers.memory.EvictionListener`, so it plugs straight into
``MemoryStore(on_evict=demoter.offer)``. It only enqueues: when the bounded queue is full the entry is dropped
and counted (``dropped``), never waited for. One worker task drains the queue into the target store; a failing
put is counted (``failed``) and skipped (caches fail open). ``stop()`` drains what is queued (bounded by
``drain_timeout``) and ends the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tiers.background import stop_task

log = logging.getLogger(__name__)


class DemotionTarget(Protocol):
    """The store that receives demoted entries (any ``KeyValueStore``)."""

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | None = None,
        tags: Iterable[str] = (),
        cost: float = 1.0,
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class Demotion:
    key: str
    value: bytes
    tags: frozenset[str]
    cost: float
    ttl: float | None
    vector: Sequence[float] | None = None


class Demoter:
    """A bounded queue and one worker moving evicted entries into ``target``."""

    def __init__(self, target: DemotionTarget, *, max_queue: int = 1024, drain_timeout: float = 5.0) -> None:
        self.target = target
        self._keeps_vectors = callable(getattr(target, "nearest", None))
        self.drain_timeout = drain_timeout
        self._queue: asyncio.Queue[Demotion] = asyncio.Queue(maxsize=max_queue)
        self._worker: asyncio.Task[None] | None = None
        self.offered = 0
        self.demoted = 0
        self.dropped = 0
        self.failed = 0

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def offer(
        self,
        key: str,
        value: bytes,
        tags: frozenset[str],
        cost: float,
        ttl: float | None,
        vector: Sequence[float] | None = None,
    ) -> None:
        """Queue one entry for L3; drop and count it when the queue is full. Never blocks.

        ``vector`` (an L2 entry's embedding) is handed on to targets that keep vectors (``ColdStore``).
        """
        self.offered += 1
        try:
            self._queue.put_nowait(Demotion(key, value, frozenset(tags), cost, ttl, vector))
        except asyncio.QueueFull:
            self.dropped += 1

    def start(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run(), name="ragproxy-demoter")

    async def stop(self) -> None:
        """Drain the queue (at most ``drain_timeout`` seconds), then end the worker."""
        if self._worker is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), self.drain_timeout)
        await stop_task(self._worker)
        self._worker = None

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if item.vector is not None and self._keeps_vectors:
                    target: Any = self.target
                    await target.put(
                        item.key, item.value, ttl=item.ttl, tags=item.tags, cost=item.cost, vector=item.vector
                    )
                else:
                    await self.target.put(item.key, item.value, ttl=item.ttl, tags=item.tags, cost=item.cost)
                self.demoted += 1
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failed += 1
                if self.failed == 1 or self.failed % 1000 == 0:
                    log.exception("demotion into L3 failed (%d so far)", self.failed)
            finally:
                self._queue.task_done()
