"""A credit store that rides out outages of the store it wraps: nothing already accepted is lost.

:class:`JournaledCreditStore` answers the :class:`~proxy.credits.store.CreditStore` contract by passing every call
to the real store (SQLite or Redis) and steps in only when that store raises
:class:`~proxy.stores.unavailable.StoreUnavailable`:

* ``reserve`` admits the request on the outage allowance (:mod:`proxy.credits.outage`): a local reservation
  of the worst case, bounded by the user's last known balance and ``credits.outage_allowance``. A user with no
  known balance, or beyond the allowance, still gets the exception (the stage answers 503, or serves unbilled
  with ``fail_open``).
* ``settle`` appends the settlement to the :class:`~proxy.credits.journal.SettlementJournal` (durable, local)
  and answers outcome ``journaled`` with the actual cost as ``charged``. This covers requests admitted
  locally and requests reserved before the outage alike.
* ``release`` of a locally admitted request only frees its share of the allowance (and tries to close the id
  in the store, in case the store took a hold whose answer was lost). A failed release of a real hold raises
  as before; the reaper returns that hold after its TTL.

:meth:`JournaledCreditStore.replay_once` (run by :class:`~proxy.credits.replayer.JournalReplayer`) settles the
journal's oldest rows in the store with their original time and removes each row only once the store answered.
Settling is idempotent by request id, so a row replayed twice (a crash between the store's answer and the
removal) charges once. A request admitted locally was never reserved, so the store charges it on its late
path: ``min(actual, available)``, the rest recorded as ``shortfall``; a request reserved before the outage is
settled against its hold, or late if the hold was reaped meanwhile.

A circuit breaker (:class:`~tiers.breaker.CircuitBreaker`) stands in front of ``reserve`` and ``settle``: after
``failures_to_open`` consecutive outages the store is not asked for ``open_seconds`` and requests go straight to
the allowance and the journal, so a store that hangs (rather than refusing connections) costs one timeout per
few requests instead of one per request. The replayer's calls are never refused by the breaker; their answers
close or reopen it, so the first successful replay ends the outage for every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.credits.journal import JournaledSettlement, SettlementJournal
from proxy.credits.outage import OutageAllowance
from proxy.credits.store import (
    ANY_ENTRY,
    Account,
    ChargeDetails,
    CreditStore,
    InsufficientCredit,
    LedgerFilter,
    LedgerPage,
    Reservation,
    Settlement,
)
from proxy.stores.unavailable import StoreUnavailable
from tiers.breaker import CircuitBreaker

log = logging.getLogger("ragproxy.credits")
T = TypeVar("T")

JOURNALED = "journaled"
"""The outcome of a settlement kept in the journal for later."""


class JournaledCreditStore:
    """The real store, with an outage allowance for reservations and a durable journal for settlements."""

    def __init__(
        self,
        store: CreditStore,
        journal: SettlementJournal,
        allowance: OutageAllowance,
        *,
        replay_batch: int = 200,
        replay_concurrency: int = 32,
        log_interval_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.store = store
        self.breaker = breaker or CircuitBreaker(failures_to_open=3, open_seconds=2.0)
        self.name = store.name
        self.journal = journal
        self.allowance = allowance
        self.replay_batch = replay_batch
        self.replay_concurrency = replay_concurrency
        self.log_interval_s = log_interval_s
        self.clock = clock
        self.admitted = 0
        """Requests admitted on the outage allowance."""
        self.refused = 0
        """Requests the outage allowance could not cover (the store's exception went on)."""
        self.journaled = 0
        self.replayed: dict[str, int] = {}
        """Replayed settlements per outcome the store gave (``settled``, ``late``, ``duplicate``, ``no_account``)."""
        self._last_log = float("-inf")

    async def recover(self) -> int:
        """Take over what a previous process left in the journal (it counts against the allowance); the depth."""
        for user, amount in (await self.journal.charges_by_user()).items():
            self.allowance.journaled(user, amount)
        if self.journal.depth:
            log.warning("%d credit settlements are waiting in the journal %s", self.journal.depth, self.journal.path)
        return self.journal.depth

    # -- passed through, remembering balances --

    async def top_up(self, user: str, amount: int, *, tenant: str = "default", note: str = "") -> int:
        available = await self.store.top_up(user, amount, tenant=tenant, note=note)
        self.allowance.remember(user, available)
        return available

    async def balance(self, user: str) -> Account:
        return await self.store.balance(user)

    async def reap_expired(self, now: float | None = None) -> int:
        return await self.store.reap_expired(now)

    async def ledger(self, where: LedgerFilter = ANY_ENTRY, cursor: str | None = None, limit: int = 100) -> LedgerPage:
        return await self.store.ledger(where, cursor, limit)

    # -- the flow, with the outage fallbacks --

    async def reserve(
        self, request_id: str, user: str, amount: int, ttl: float, *, now: float | None = None
    ) -> Reservation | InsufficientCredit:
        try:
            answer = await self._guarded(self.store.reserve(request_id, user, amount, ttl, now=now))
        except StoreUnavailable as exc:
            left = self.allowance.admit(request_id, user, amount, ttl)
            if left is None:
                self.refused += 1
                self._log_outage(exc)
                raise
            self.admitted += 1
            self._log_outage(exc)
            return Reservation(request_id, user, amount, (self.clock() if now is None else now) + ttl, left)
        self.allowance.remember(user, answer.available_after if isinstance(answer, Reservation) else answer.available)
        return answer

    async def settle(
        self, request_id: str, user: str, actual: int, details: ChargeDetails, *, now: float | None = None
    ) -> Settlement:
        """Settle in the store, or else in the journal (shielded: a cancelled caller does not lose the charge)."""
        return await asyncio.shield(self._settle(request_id, user, actual, details, now))

    async def _settle(
        self, request_id: str, user: str, actual: int, details: ChargeDetails, now: float | None
    ) -> Settlement:
        try:
            settlement = await self._guarded(self.store.settle(request_id, user, actual, details, now=now))
        except StoreUnavailable as exc:
            at = self.clock() if now is None else now
            await self.journal.append(JournaledSettlement(request_id, user, actual, details, at))
            self.allowance.finish(request_id)
            self.allowance.journaled(user, actual)
            self.journaled += 1
            self._log_outage(exc)
            known = self.allowance.known(user)
            left = 0 if known is None else max(known - self.allowance.spent(user), 0)
            return Settlement(request_id, JOURNALED, actual, left)
        self.allowance.finish(request_id)
        self._learn(user, settlement)
        return settlement

    async def release(self, request_id: str, user: str) -> bool:
        if self.allowance.finish(request_id) is None:
            return await self.store.release(request_id, user)
        with contextlib.suppress(StoreUnavailable):  # a hold the store took but could not confirm
            return await self.store.release(request_id, user)
        return False

    async def _guarded(self, call: Awaitable[T]) -> T:
        """``call`` unless the breaker is open; its outcome feeds the breaker."""
        if not self.breaker.allow():
            if asyncio.iscoroutine(call):
                call.close()
            raise StoreUnavailable("the credit store failed repeatedly; not asked for a moment (breaker open)")
        try:
            result = await call
        except StoreUnavailable:
            self.breaker.failure()
            raise
        self.breaker.success()
        return result

    def _learn(self, user: str, settlement: Settlement) -> None:
        if settlement.outcome == "no_account":
            self.allowance.forget(user)
        else:
            self.allowance.remember(user, settlement.available)

    def _log_outage(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_log >= self.log_interval_s:
            self._last_log = now
            log.error(
                "credit store unavailable (%s): %d requests admitted on the outage allowance, %d refused, "
                "%d settlements journaled so far",
                exc, self.admitted, self.refused, self.journaled,
            )

    # -- the journal, back into the store --

    async def replay_once(self) -> int:
        """Settle up to ``replay_batch`` journaled settlements in the store; how many it confirmed.

        Raises :class:`StoreUnavailable` when the store took none of them.
        """
        entries = await self.journal.oldest(self.replay_batch)
        confirmed: list[JournaledSettlement] = []
        failure: BaseException | None = None
        for start in range(0, len(entries), self.replay_concurrency):
            chunk = entries[start:start + self.replay_concurrency]
            answers = await asyncio.gather(*(self._replay(entry) for entry in chunk), return_exceptions=True)
            for entry, answer in zip(chunk, answers, strict=True):
                if isinstance(answer, Settlement):
                    confirmed.append(entry)
                    self.replayed[answer.outcome] = self.replayed.get(answer.outcome, 0) + 1
                    self._learn(entry.user, answer)
                else:
                    failure = failure or answer
                    if not isinstance(answer, StoreUnavailable):
                        log.error("replaying settlement %s of %s failed: %r", entry.request_id, entry.user, answer)
            if isinstance(failure, StoreUnavailable):
                break
        await self.journal.remove(confirmed)
        for entry in confirmed:
            self.allowance.replayed(entry.user, entry.actual)
        if failure is not None and not confirmed:
            if isinstance(failure, StoreUnavailable):
                raise failure
            raise StoreUnavailable(f"replaying the settlement journal failed: {failure!r}") from failure
        return len(confirmed)

    async def _replay(self, entry: JournaledSettlement) -> Settlement:
        try:
            answer = await self.store.settle(entry.request_id, entry.user, entry.actual, entry.details,
                                             now=entry.time)
        except StoreUnavailable:
            self.breaker.failure()
            raise
        self.breaker.success()  # the store is back: requests stop going around it
        return answer

    async def close(self) -> None:
        try:
            await self.journal.close()
        finally:
            await self.store.close()
