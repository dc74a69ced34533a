"""How much a user may spend on this replica while the credit store is down: the outage allowance. Pure.

A request whose reservation the store cannot take is admitted locally when the user's last known available
balance (remembered from recent reservations and settlements, for at most ``known_users`` users) minus what this
replica already let the user spend since, and at most ``allowance`` micro-credits in all, still covers its worst
case. "Already spent since" is the worst case of the user's requests admitted locally and still running, plus
the charges the settlement journal holds for the user (in full, also for a request whose hold the store took
before the outage: the allowance errs on the safe side).

With ``N`` replicas each one has its own allowance, so a user may spend up to ``N * allowance`` that no store
checked; a charge the balance cannot cover when the journal is replayed is capped at the balance and recorded
as ``shortfall`` (the balance never goes negative). ``allowance == 0`` admits nothing (fail closed).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LocalAdmission:
    """A request let through on the allowance, until it settles or is released."""

    user: str
    amount: int
    expires_at: float


class OutageAllowance:
    """Known balances, local admissions and journaled excess per user; decides admissions during an outage."""

    def __init__(
        self, allowance: int, *, known_users: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if allowance < 0:
            raise ValueError("the outage allowance cannot be negative")
        self.allowance = allowance
        self.known_users = known_users
        self.clock = clock
        self._known: OrderedDict[str, int] = OrderedDict()
        self._admitted: dict[str, LocalAdmission] = {}
        self._running: dict[str, int] = {}
        self._journaled: dict[str, int] = {}
        self._admissions = 0

    # -- what the store said --

    def remember(self, user: str, available: int) -> None:
        """The store's latest ``available`` for ``user`` (least recently seen users are forgotten first)."""
        self._known[user] = available
        self._known.move_to_end(user)
        while len(self._known) > self.known_users:
            self._known.popitem(last=False)

    def forget(self, user: str) -> None:
        self._known.pop(user, None)

    def known(self, user: str) -> int | None:
        return self._known.get(user)

    # -- what this replica let through --

    def spent(self, user: str) -> int:
        """What this replica let ``user`` spend that the store has not accounted for yet."""
        return self._running.get(user, 0) + self._journaled.get(user, 0)

    def admit(self, request_id: str, user: str, amount: int, ttl: float) -> int | None:
        """Admit ``amount`` for ``request_id`` locally: what is left of the allowance after it, or ``None``."""
        self._drop_expired()
        known = self._known.get(user)
        if known is None or self.allowance <= 0:
            return None
        self.finish(request_id)
        left = min(known, self.allowance) - self.spent(user)
        if amount > left:
            return None
        self._admitted[request_id] = LocalAdmission(user, amount, self.clock() + ttl)
        self._running[user] = self._running.get(user, 0) + amount
        return left - amount

    def admitted(self, request_id: str) -> LocalAdmission | None:
        return self._admitted.get(request_id)

    def finish(self, request_id: str) -> LocalAdmission | None:
        """The request settled or was released: it no longer counts as running."""
        admission = self._admitted.pop(request_id, None)
        if admission is not None:
            _take(self._running, admission.user, admission.amount)
        return admission

    def journaled(self, user: str, amount: int) -> None:
        """A settlement of ``amount`` went to the journal."""
        if amount > 0:
            self._journaled[user] = self._journaled.get(user, 0) + amount

    def replayed(self, user: str, amount: int) -> None:
        """A journaled settlement of ``amount`` reached the store."""
        _take(self._journaled, user, amount)

    def _drop_expired(self) -> None:
        """Every 256 calls, forget admissions past their deadline (a request that never finished must not keep
        holding the allowance)."""
        self._admissions += 1
        if self._admissions % 256:
            return
        now = self.clock()
        for request_id in [rid for rid, a in self._admitted.items() if a.expires_at <= now]:
            self.finish(request_id)


def _take(sums: dict[str, int], user: str, amount: int) -> None:
    left = sums.get(user, 0) - max(amount, 0)
    if left > 0:
        sums[user] = left
    else:
        sums.pop(user, None)
