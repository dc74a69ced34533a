"""The settlement journal: settlements the credit store could not take, kept durably on local disk until it can.

One SQLite file under ``data_dir`` (WAL, ``synchronous=FULL`` by default: a journaled settlement survives a crash
of the process and a power cut). A row holds what ``settle`` needs: request id, user, actual cost, the
:class:`~proxy.credits.store.ChargeDetails` and the time of the settlement. Rows are appended in groups (every
settlement that arrives while a commit runs joins the next one, so a burst costs one fsync per group, not one per
settlement) and removed only after the store confirmed them; a new process on the same file finds what the
previous one left. A request id is journaled at most once per user.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from proxy.credits.settings import CreditsSettings
from proxy.credits.store import ChargeDetails
from proxy.stores.sqlite_worker import SqliteWorker
from proxy.stores.unavailable import StoreUnavailable

_CREDITS = CreditsSettings()  # the defaults, defined once there

SCHEMA = """
CREATE TABLE IF NOT EXISTS settlements (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    user TEXT NOT NULL,
    actual INTEGER NOT NULL CHECK (actual >= 0),
    time REAL NOT NULL,
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    tier TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    usage_source TEXT NOT NULL,
    UNIQUE (user, request_id)
);
"""

_COLUMNS = (
    "request_id, user, actual, time, tenant, model, tier, prompt_tokens, completion_tokens, cached_tokens, "
    "usage_source"
)


@dataclass(frozen=True, slots=True)
class JournaledSettlement:
    """One settlement waiting for the store."""

    request_id: str
    user: str
    actual: int
    details: ChargeDetails
    time: float
    """Epoch seconds of the settlement: the ledger entry gets this time, not the time of the replay."""
    seq: int = 0
    """Its place in the journal (set when read back)."""


@dataclass
class _Waiting:
    entries: list[tuple[JournaledSettlement, asyncio.Future[None]]] = field(default_factory=list)


class SettlementJournal:
    """Durable, append-in-groups, remove-when-confirmed list of settlements (see the module docstring)."""

    def __init__(self, path: str | Path, *, synchronous: str = _CREDITS.sqlite_synchronous,
                 busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self._db = SqliteWorker(path, SCHEMA, busy_timeout_s=busy_timeout_s, synchronous=synchronous)
        self.depth = 0
        """Settlements in the journal (as last counted, plus appends, minus removals)."""
        self._waiting = _Waiting()
        self._writer: asyncio.Task[None] | None = None

    async def append(self, entry: JournaledSettlement) -> None:
        """Write ``entry`` durably; returns once it is committed (:class:`StoreUnavailable` if it failed)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.entries.append((entry, done))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_groups(), name="credit-journal-writer")
        await done

    async def _write_groups(self) -> None:
        try:
            while self._waiting.entries:
                group, self._waiting = self._waiting, _Waiting()
                rows = [_row(entry) for entry, _ in group.entries]
                failure: Exception | None = None
                try:
                    self.depth += await self._db.transaction(partial(_insert, rows=rows))
                except Exception as exc:  # disk full, I/O error: the caller keeps the settlement another way
                    failure = exc
                for _, done in group.entries:
                    if done.done():
                        continue
                    if failure is None:
                        done.set_result(None)
                    else:
                        done.set_exception(StoreUnavailable(f"settlement journal {self.path}: {failure}"))
        finally:
            self._writer = None

    async def oldest(self, limit: int = 200) -> list[JournaledSettlement]:
        """Up to ``limit`` settlements, oldest first (and the depth, recounted)."""

        def read(conn: sqlite3.Connection) -> tuple[int, list[tuple[Any, ...]]]:
            count = conn.execute("SELECT COUNT(*) FROM settlements").fetchone()[0]
            rows = conn.execute(f"SELECT seq, {_COLUMNS} FROM settlements ORDER BY seq LIMIT ?", (limit,)).fetchall()
            return int(count), rows

        count, rows = await self._db.transaction(read, write=False)
        self.depth = count
        return [_entry(row) for row in rows]

    async def remove(self, entries: list[JournaledSettlement]) -> None:
        """Forget settlements the store confirmed."""
        if not entries:
            return
        seqs = [(entry.seq,) for entry in entries]

        def delete(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany("DELETE FROM settlements WHERE seq = ?", seqs)
            return conn.total_changes - before

        self.depth = max(self.depth - await self._db.transaction(delete), 0)

    async def charges_by_user(self) -> dict[str, int]:
        """Per user, the sum of the journaled charges (recounts the depth too)."""

        def read(conn: sqlite3.Connection) -> tuple[int, list[tuple[str, int]]]:
            count = conn.execute("SELECT COUNT(*) FROM settlements").fetchone()[0]
            rows = conn.execute(
                "SELECT user, SUM(actual) FROM settlements GROUP BY user"
            ).fetchall()
            return int(count), rows

        count, rows = await self._db.transaction(read, write=False)
        self.depth = count
        return {str(user): int(total) for user, total in rows if total}

    async def close(self) -> None:
        """Finish the group being written, then close the file."""
        while self._writer is not None:
            await asyncio.shield(self._writer)
        await self._db.close()


def _row(entry: JournaledSettlement) -> tuple[object, ...]:
    d = entry.details
    return (entry.request_id, entry.user, entry.actual, entry.time, d.tenant, d.model, d.tier,
            d.prompt_tokens, d.completion_tokens, d.cached_tokens, d.usage_source)


def _insert(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> int:
    before = conn.total_changes
    conn.executemany(f"INSERT OR IGNORE INTO settlements ({_COLUMNS}) VALUES ({', '.join('?' * 11)})", rows)
    return conn.total_changes - before


def _entry(row: tuple[Any, ...]) -> JournaledSettlement:
    seq, request_id, user, actual, at, tenant, model, tier, prompt, completion, cached, source = row
    details = ChargeDetails(tenant=tenant, model=model, tier=tier, prompt_tokens=prompt, completion_tokens=completion,
                            cached_tokens=cached, usage_source=source)
    return JournaledSettlement(request_id, user, actual, details, at, seq)
