"""The background task that empties the settlement journal into the credit store once the store answers again.

Every ``interval_s`` seconds, while the journal holds settlements, it replays them batch after batch
(:meth:`~proxy.credits.journaled_store.JournaledCreditStore.replay_once`) until the journal is empty or the store
fails again. At start it takes over what a previous process left; at stop it tries one last, bounded drain and
leaves the rest on disk for the next process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from proxy.credits.journaled_store import JournaledCreditStore
from proxy.credits.settings import CreditsSettings
from proxy.stores.unavailable import StoreUnavailable
from tiers.background import stop_task

_CREDITS = CreditsSettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.credits")


class JournalReplayer:
    """Replays the journal of ``store`` every ``interval_s`` seconds until stopped."""

    def __init__(self, store: JournaledCreditStore, *, interval_s: float = _CREDITS.journal_replay_interval_s,
                 final_drain_s: float = 5.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self.final_drain_s = final_drain_s
        self._task: asyncio.Task[None] | None = None
        self._last_warning = float("-inf")

    async def drain(self) -> int:
        """Replay until the journal is empty or the store fails; how many settlements reached the store."""
        replayed = 0
        while self.store.journal.depth:
            try:
                done = await self.store.replay_once()
            except StoreUnavailable as exc:
                now = time.monotonic()
                if now - self._last_warning >= 60.0:
                    self._last_warning = now
                    log.warning("%d journaled credit settlements wait for the store: %s",
                                self.store.journal.depth, exc)
                break
            if not done:
                break
            replayed += done
        if replayed:
            log.info("replayed %d journaled credit settlements; %d left", replayed, self.store.journal.depth)
        return replayed

    async def _run(self) -> None:
        while True:
            try:
                await self.drain()
            except Exception:  # a background task must outlive any one failure
                log.exception("replaying the credit journal failed unexpectedly")
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        """Take over the journal a previous process left, then replay in the background."""
        if self._task is None:
            await self.store.recover()
            self._task = asyncio.create_task(self._run(), name="credit-journal-replayer")

    async def stop(self) -> None:
        if self._task is None:
            return
        await stop_task(self._task)
        self._task = None
        with contextlib.suppress(asyncio.TimeoutError, StoreUnavailable):
            await asyncio.wait_for(self.drain(), self.final_drain_s)
        if self.store.journal.depth:
            log.warning("%d credit settlements stay in the journal %s for the next start",
                        self.store.journal.depth, self.store.journal.path)
