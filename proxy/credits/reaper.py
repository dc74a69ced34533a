"""The background task that returns the reservations of dead proxies: ``store.reap_expired`` every interval.

Every replica may run one; reaping is atomic per user and idempotent, so replicas reaping at once do no harm.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.credits.store import CreditStore
from proxy.stores.unavailable import StoreUnavailable
from tiers.background import stop_task

log = logging.getLogger("ragproxy.credits")


class ReservationReaper:
    """Calls ``reap_expired`` every ``interval_s`` seconds until stopped."""

    def __init__(self, store: CreditStore, *, interval_s: float = 30.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self.reaped = 0
        self._task: asyncio.Task[None] | None = None

    async def reap_once(self) -> int:
        released = await self.store.reap_expired()
        self.reaped += released
        if released:
            log.info("released %d expired credit reservations", released)
        return released

    async def _run(self) -> None:
        while True:
            try:
                await self.reap_once()
            except StoreUnavailable as exc:
                log.warning("reaping reservations failed: %s", exc)
            except Exception:  # a background task must outlive any one failure
                log.exception("reaping reservations failed unexpectedly")
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="credit-reaper")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
