"""The embedded credit store: one SQLite file in WAL mode (see :mod:`proxy.credits.store` for the semantics).

Layout: ``accounts`` (available and held, both ``CHECK >= 0``, so a bug that would overdraw aborts the
transaction instead), ``holds`` (open reservations with their deadline), ``closed`` (settled or released
request ids; both keyed by user and request id, as in Redis; pruned after the retention period by
``reap_expired``) and ``ledger`` (append-only: triggers abort any UPDATE or DELETE). Each operation is one
``BEGIN IMMEDIATE`` transaction run by :class:`~proxy.stores.sqlite_worker.SqliteWorker`, so processes
sharing the file serialize on SQLite's write lock.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.credits.settings import CreditsSettings
from proxy.credits.store import (
    ANY_ENTRY,
    Account,
    ChargeDetails,
    InsufficientCredit,
    LedgerEntry,
    LedgerFilter,
    LedgerPage,
    RequestClosed,
    Reservation,
    Settlement,
    decode_cursor,
    encode_cursor,
)
from proxy.stores.sqlite_worker import SqliteWorker

_CREDITS = CreditsSettings()  # the defaults, defined once there

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    user TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    available INTEGER NOT NULL CHECK (available >= 0),
    held INTEGER NOT NULL CHECK (held >= 0)
);
CREATE TABLE IF NOT EXISTS holds (
    user TEXT NOT NULL,
    request_id TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount >= 0),
    expires_at REAL NOT NULL,
    PRIMARY KEY (user, request_id)
);
CREATE INDEX IF NOT EXISTS holds_by_deadline ON holds (expires_at);
CREATE TABLE IF NOT EXISTS closed (
    user TEXT NOT NULL,
    request_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    charged INTEGER NOT NULL,
    closed_at REAL NOT NULL,
    PRIMARY KEY (user, request_id)
);
CREATE INDEX IF NOT EXISTS closed_by_time ON closed (closed_at);
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    user TEXT NOT NULL,
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    amount INTEGER NOT NULL,
    balance_after INTEGER NOT NULL,
    time REAL NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    tier TEXT NOT NULL DEFAULT '',
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    usage_source TEXT NOT NULL DEFAULT '',
    shortfall INTEGER NOT NULL DEFAULT 0,
    note TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS ledger_by_user ON ledger (user, seq);
CREATE TRIGGER IF NOT EXISTS ledger_is_append_only_u BEFORE UPDATE ON ledger
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_is_append_only_d BEFORE DELETE ON ledger
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"""

_LEDGER_COLUMNS = (
    "request_id, user, tenant, kind, amount, balance_after, time, model, tier, prompt_tokens, "
    "completion_tokens, cached_tokens, usage_source, shortfall, note"
)


class SqliteCreditStore:
    """Credit store in one local SQLite file (embedded mode)."""

    name = "sqlite"

    def __init__(
        self,
        path: str | Path = "ragproxy-credits.sqlite3",
        *,
        finished_retention_s: float = 7 * 86400,
        busy_timeout_s: float = 5.0,
        synchronous: str = _CREDITS.sqlite_synchronous,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``synchronous``: ``FULL`` (default) makes every committed ledger entry survive a power cut, at one
        fsync per operation; ``NORMAL`` survives a crash of the process (WAL) but may lose the last commits on
        a power cut, for about ten times the throughput on a slow disk.
        """
        self._db = SqliteWorker(path, SCHEMA, busy_timeout_s=busy_timeout_s, synchronous=synchronous)
        self.finished_retention_s = finished_retention_s
        self.clock = clock

    async def close(self) -> None:
        await self._db.close()

    async def top_up(self, user: str, amount: int, *, tenant: str = "default", note: str = "") -> int:
        if amount <= 0:
            raise ValueError("a top-up must be positive")
        now = self.clock()

        def work(conn: sqlite3.Connection) -> int:
            conn.execute(
                "INSERT INTO accounts (user, tenant, available, held) VALUES (?, ?, ?, 0) "
                "ON CONFLICT (user) DO UPDATE SET available = available + excluded.available",
                (user, tenant, amount),
            )
            available, held, owner = conn.execute(
                "SELECT available, held, tenant FROM accounts WHERE user = ?", (user,)
            ).fetchone()
            _append(
                conn,
                LedgerEntry(
                    f"topup-{uuid.uuid4().hex}",
                    user,
                    owner,
                    "top_up",
                    amount,
                    available + held,
                    now,
                    note=note,
                ),
            )
            return int(available)

        return await self._db.transaction(work)

    async def balance(self, user: str) -> Account:
        def work(conn: sqlite3.Connection) -> Account:
            row = conn.execute("SELECT tenant, available, held FROM accounts WHERE user = ?", (user,)).fetchone()
            return Account(user, "", 0, 0) if row is None else Account(user, row[0], row[1], row[2])

        return await self._db.transaction(work, write=False)

    async def reserve(
        self, request_id: str, user: str, amount: int, ttl: float, *, now: float | None = None
    ) -> Reservation | InsufficientCredit:
        if amount < 0:
            raise ValueError("a reservation cannot be negative")
        expires_at = (self.clock() if now is None else now) + ttl

        def work(conn: sqlite3.Connection) -> Reservation | InsufficientCredit:
            if conn.execute("SELECT 1 FROM closed WHERE user = ? AND request_id = ?", (user, request_id)).fetchone():
                raise RequestClosed(request_id)
            account = conn.execute("SELECT available FROM accounts WHERE user = ?", (user,)).fetchone()
            available = 0 if account is None else int(account[0])
            hold = conn.execute(
                "SELECT amount, expires_at FROM holds WHERE user = ? AND request_id = ?", (user, request_id)
            ).fetchone()
            if hold is not None:
                return Reservation(request_id, user, hold[0], hold[1], available)
            if account is None or available < amount:
                return InsufficientCredit(user, available, amount)
            conn.execute(
                "UPDATE accounts SET available = available - ?, held = held + ? WHERE user = ?",
                (amount, amount, user),
            )
            conn.execute(
                "INSERT INTO holds (request_id, user, amount, expires_at) VALUES (?, ?, ?, ?)",
                (request_id, user, amount, expires_at),
            )
            return Reservation(request_id, user, amount, expires_at, available - amount)

        return await self._db.transaction(work)

    async def settle(
        self, request_id: str, user: str, actual: int, details: ChargeDetails, *, now: float | None = None
    ) -> Settlement:
        if actual < 0:
            raise ValueError("a charge cannot be negative")
        at = self.clock() if now is None else now

        def work(conn: sqlite3.Connection) -> Settlement:
            account = conn.execute("SELECT available, held FROM accounts WHERE user = ?", (user,)).fetchone()
            done = conn.execute(
                "SELECT charged FROM closed WHERE user = ? AND request_id = ?", (user, request_id)
            ).fetchone()
            if done is not None:
                return Settlement(request_id, "duplicate", int(done[0]), 0 if account is None else account[0])
            if account is None:
                conn.execute("INSERT INTO closed VALUES (?, ?, 'no_account', 0, ?)", (user, request_id, at))
                return Settlement(request_id, "no_account", 0, 0)
            available, held = int(account[0]), int(account[1])
            hold_row = conn.execute(
                "SELECT amount FROM holds WHERE user = ? AND request_id = ?", (user, request_id)
            ).fetchone()
            hold = 0 if hold_row is None else int(hold_row[0])
            charged = min(actual, hold + available)
            available, held = available + hold - charged, held - hold
            conn.execute("UPDATE accounts SET available = ?, held = ? WHERE user = ?", (available, held, user))
            conn.execute("DELETE FROM holds WHERE user = ? AND request_id = ?", (user, request_id))
            conn.execute("INSERT INTO closed VALUES (?, ?, 'settled', ?, ?)", (user, request_id, charged, at))
            _append(
                conn,
                LedgerEntry(
                    request_id,
                    user,
                    details.tenant,
                    "charge",
                    -charged,
                    available + held,
                    at,
                    model=details.model,
                    tier=details.tier,
                    prompt_tokens=details.prompt_tokens,
                    completion_tokens=details.completion_tokens,
                    cached_tokens=details.cached_tokens,
                    usage_source=details.usage_source,
                    shortfall=actual - charged,
                ),
            )
            outcome = "settled" if hold_row is not None else "late"
            return Settlement(request_id, outcome, charged, available, actual - charged)

        return await self._db.transaction(work)

    async def release(self, request_id: str, user: str) -> bool:
        at = self.clock()

        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute("SELECT 1 FROM closed WHERE user = ? AND request_id = ?", (user, request_id)).fetchone():
                return False
            conn.execute("INSERT INTO closed VALUES (?, ?, 'released', 0, ?)", (user, request_id, at))
            return _drop_hold(conn, user, request_id)

        return await self._db.transaction(work)

    async def reap_expired(self, now: float | None = None) -> int:
        at = self.clock() if now is None else now

        def work(conn: sqlite3.Connection) -> int:
            expired = conn.execute("SELECT user, request_id FROM holds WHERE expires_at < ?", (at,)).fetchall()
            for user, request_id in expired:
                _drop_hold(conn, user, request_id)
            conn.execute("DELETE FROM closed WHERE closed_at < ?", (at - self.finished_retention_s,))
            return len(expired)

        return await self._db.transaction(work)

    async def ledger(self, where: LedgerFilter = ANY_ENTRY, cursor: str | None = None, limit: int = 100) -> LedgerPage:
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("user", where.user),
            ("tenant", where.tenant),
            ("model", where.model),
            ("kind", where.kind),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if where.since is not None:
            clauses.append("time >= ?")
            params.append(where.since)
        if where.until is not None:
            clauses.append("time < ?")
            params.append(where.until)
        if cursor is not None:
            after_user, position = decode_cursor(cursor)
            after_seq = int(position)
            clauses.append("(user > ? OR (user = ? AND seq > ?))")
            params += [after_user, after_user, after_seq]
        sql = f"SELECT seq, {_LEDGER_COLUMNS} FROM ledger"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY user, seq LIMIT ?"
        params.append(limit + 1)

        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(sql, params).fetchall()

        rows = await self._db.transaction(work, write=False)
        more = len(rows) > limit
        rows = rows[:limit]
        entries = [LedgerEntry(*row[1:]) for row in rows]
        next_cursor = encode_cursor(rows[-1][2], str(rows[-1][0])) if more and rows else None
        return LedgerPage(entries, next_cursor)


def _drop_hold(conn: sqlite3.Connection, user: str, request_id: str) -> bool:
    row = conn.execute("SELECT amount FROM holds WHERE user = ? AND request_id = ?", (user, request_id)).fetchone()
    if row is None:
        return False
    conn.execute(
        "UPDATE accounts SET available = available + ?, held = held - ? WHERE user = ?",
        (row[0], row[0], user),
    )
    conn.execute("DELETE FROM holds WHERE user = ? AND request_id = ?", (user, request_id))
    return True


def _append(conn: sqlite3.Connection, entry: LedgerEntry) -> None:
    conn.execute(
        f"INSERT INTO ledger ({_LEDGER_COLUMNS}) VALUES ({', '.join('?' * 15)})",
        (
            entry.request_id,
            entry.user,
            entry.tenant,
            entry.kind,
            entry.amount,
            entry.balance_after,
            entry.time,
            entry.model,
            entry.tier,
            entry.prompt_tokens,
            entry.completion_tokens,
            entry.cached_tokens,
            entry.usage_source,
            entry.shortfall,
            entry.note,
        ),
    )
