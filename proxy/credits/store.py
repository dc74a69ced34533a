"""The credit store contract: balances, reserve-then-settle, and the append-only ledger.

Amounts are integer micro-credits (see :mod:`proxy.credits.pricing`). An account has two parts: ``available``
(what new reservations may take) and ``held`` (the sum of open reservations). Every operation is atomic:

* ``reserve`` moves the worst case from available to held, or answers :class:`InsufficientCredit`. Reserving
  an id that is already open answers the same reservation again (a retried call holds once).
* ``settle`` charges the actual cost, returns the rest of the hold to available and appends one ledger entry.
  It is idempotent by request id: a second settle (or a settle after a release) changes nothing and answers
  ``duplicate``. The charge is ``min(actual, hold + available)``, so a cost above the reservation is drawn
  from the free balance and the balance never goes negative; ``actual - charged`` is recorded as
  ``shortfall``.
* A settle after the reservation expired and was reaped (a request that outlived the reservation TTL, or whose
  proxy restarted) is **charged late**: the work was done, so its cost is taken from the available balance,
  capped at it, and recorded with outcome ``late``. Reaping does not close a request id; releasing does. A
  settle for an id that was never reserved takes the same path: this is how a request admitted during an
  outage of the store is billed when its journaled settlement is replayed (see
  :mod:`proxy.credits.journaled_store`). ``now``, when given, is the time the ledger entry records.
* ``release`` returns a hold untouched (upstream error, aborted stream) and closes the request id.
* ``reap_expired`` releases the holds whose deadline passed (a proxy died mid-request) without closing their
  ids.
* ``top_up`` adds credit and appends a ledger entry.

Invariants every backend keeps (the conformance suite checks them): available and held are never negative; the
sum of the ledger's ``amount`` over an account equals the change of ``available + held``; no request id is
charged twice. Request ids stay closed for a retention period (``finished_retention_s``, default 7 days) after
which a stale retry could charge again; the ledger itself is never trimmed.

The ledger is listed in the order (user, time of entry); the cursor is opaque.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, fields
from typing import Protocol, runtime_checkable

import orjson

from proxy.credits.pricing import format_credits


@dataclass(frozen=True, slots=True)
class Reservation:
    """The credits held for one request (:data:`proxy.credits.stages.RESERVATION`, given by
    :class:`proxy.credits.stages.Credits`)."""

    request_id: str
    user: str
    amount: int
    expires_at: float
    available_after: int
    """What the account had left to reserve right after this hold."""


class RequestClosed(Exception):
    """A reservation was asked for a request id that was already settled or released."""


@dataclass(frozen=True, slots=True)
class Account:
    user: str
    tenant: str
    available: int
    held: int

    @property
    def balance(self) -> int:
        return self.available + self.held


@dataclass(frozen=True, slots=True)
class InsufficientCredit:
    """The answer to a reservation the account cannot cover."""

    user: str
    available: int
    needed: int


@dataclass(frozen=True, slots=True)
class ChargeDetails:
    """What a settlement records about the request besides the amount."""

    tenant: str = "anonymous"
    model: str = ""
    tier: str = "upstream"
    """Where the reply came from: ``upstream``, ``l1``, ``l2``, ``l3`` or ``retrieval``."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    usage_source: str = "reported"
    """``reported`` (usage from the backend), ``reserved`` (none reported: the reservation was charged),
    ``relayed`` (a stream the client abandoned: the bounded prompt and the completion relayed until then) or
    ``searches`` (vector searches, priced per search) or ``request`` (a flat price per forwarded request)."""


@dataclass(frozen=True, slots=True)
class Settlement:
    request_id: str
    outcome: str
    """``settled``, ``late`` (after expiry, or never reserved), ``duplicate`` (already closed), ``no_account``, or
    ``journaled`` (kept in the local journal until the store is back; ``charged`` is then the actual cost)."""
    charged: int
    available: int
    shortfall: int = 0


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One line of the append-only ledger; ``amount`` is signed (top-ups positive, charges negative)."""

    request_id: str
    user: str
    tenant: str
    kind: str
    """``charge`` or ``top_up``."""
    amount: int
    balance_after: int
    time: float
    model: str = ""
    tier: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    usage_source: str = ""
    shortfall: int = 0
    note: str = ""

    @property
    def cost(self) -> int:
        return -self.amount if self.kind == "charge" else 0


@dataclass(frozen=True, slots=True)
class LedgerFilter:
    """Which entries to list; ``None`` = any. ``since`` inclusive, ``until`` exclusive (epoch seconds)."""

    user: str | None = None
    tenant: str | None = None
    model: str | None = None
    kind: str | None = None
    since: float | None = None
    until: float | None = None

    def matches(self, entry: LedgerEntry) -> bool:
        return (
            (self.user is None or entry.user == self.user)
            and (self.tenant is None or entry.tenant == self.tenant)
            and (self.model is None or entry.model == self.model)
            and (self.kind is None or entry.kind == self.kind)
            and (self.since is None or entry.time >= self.since)
            and (self.until is None or entry.time < self.until)
        )


ANY_ENTRY = LedgerFilter()


@dataclass(frozen=True, slots=True)
class LedgerPage:
    entries: list[LedgerEntry]
    next_cursor: str | None
    """Pass back to get the next page; ``None`` at the end."""


def encode_cursor(user: str, position: str) -> str:
    """An opaque ledger cursor: the last entry returned (its user and its place in that user's entries)."""
    return base64.urlsafe_b64encode(orjson.dumps([user, position])).decode()


def decode_cursor(cursor: str) -> tuple[str, str]:
    """``(user, position)`` of a cursor made by :func:`encode_cursor`; ``ValueError`` when it is not one."""
    try:
        user, position = orjson.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (binascii.Error, orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a ledger cursor: {cursor!r}") from exc
    return str(user), str(position)


@runtime_checkable
class CreditStore(Protocol):
    """Balances, reservations and the ledger, atomically (see the module docstring for the semantics)."""

    name: str

    async def top_up(self, user: str, amount: int, *, tenant: str = "default", note: str = "") -> int:
        """Add ``amount`` (> 0) to ``user``'s available credit, creating the account; the new available."""

    async def balance(self, user: str) -> Account:
        """The account (zeros for an unknown user)."""

    async def reserve(
        self, request_id: str, user: str, amount: int, ttl: float, *, now: float | None = None
    ) -> Reservation | InsufficientCredit:
        """Hold ``amount`` for ``ttl`` seconds, or say why not."""

    async def settle(
        self, request_id: str, user: str, actual: int, details: ChargeDetails, *, now: float | None = None
    ) -> Settlement:
        """Charge ``actual`` for the request, return the rest of its hold, append a ledger entry."""

    async def release(self, request_id: str, user: str) -> bool:
        """Return the whole hold and close the request id; ``True`` if a hold was open."""

    async def reap_expired(self, now: float | None = None) -> int:
        """Release every hold whose deadline is before ``now``; the number released."""

    async def ledger(self, where: LedgerFilter = ANY_ENTRY, cursor: str | None = None, limit: int = 100) -> LedgerPage:
        """One page of ledger entries matching ``where``."""

    async def close(self) -> None:
        """Release connections and threads."""


LEDGER_CSV_COLUMNS = tuple(f.name for f in fields(LedgerEntry))


async def ledger_entries(
    store: CreditStore, where: LedgerFilter = ANY_ENTRY, page_size: int = 500
) -> AsyncIterator[LedgerEntry]:
    """Every entry matching ``where``, page by page."""
    cursor: str | None = None
    while True:
        page = await store.ledger(where, cursor, page_size)
        for entry in page.entries:
            yield entry
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def ledger_csv_rows(entries: Iterable[LedgerEntry], *, header: bool = True) -> str:
    """CSV text of ``entries``: amounts in credits (``-0.0125``), time as epoch seconds."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(LEDGER_CSV_COLUMNS)
    for entry in entries:
        row = asdict(entry)
        row["amount"] = format_credits(entry.amount)
        row["balance_after"] = format_credits(entry.balance_after)
        row["shortfall"] = format_credits(entry.shortfall)
        writer.writerow([row[name] for name in LEDGER_CSV_COLUMNS])
    return out.getvalue()


async def export_ledger_csv(store: CreditStore, where: LedgerFilter = ANY_ENTRY) -> AsyncIterator[str]:
    """The ledger as CSV text in pieces (header first), for a streamed admin download."""
    yield ledger_csv_rows([], header=True)
    batch: list[LedgerEntry] = []
    async for entry in ledger_entries(store, where):
        batch.append(entry)
        if len(batch) >= 500:
            yield ledger_csv_rows(batch, header=False)
            batch = []
    if batch:
        yield ledger_csv_rows(batch, header=False)
