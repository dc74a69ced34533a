"""API keys in the embedded SQLite database (table ``api_keys``; see :mod:`proxy.credits.keys`).

The change feed: every change after a key's creation stamps it with the next position of ``key_feed`` (one row)
in ``changed_seq``; :meth:`SqliteKeyStore.changes` reads the keys stamped after a position.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.credits.keys import ApiKey, CreatedKey, KeyChanges, display_of, key_hash, matches, new_key, new_key_id
from proxy.credits.sqlite_worker import SqliteWorker

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL UNIQUE,
    user TEXT NOT NULL,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    display TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL,
    changed_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS key_feed (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT OR IGNORE INTO key_feed VALUES (1, 0);
"""

_ADDED_COLUMNS = {"changed_seq": "INTEGER NOT NULL DEFAULT 0"}
"""Columns of ``api_keys`` that files made by earlier versions lack."""


def _migrate(conn: sqlite3.Connection) -> None:
    present = {row[1] for row in conn.execute("PRAGMA table_info(api_keys)")}
    for column, declaration in _ADDED_COLUMNS.items():
        if column not in present:
            conn.execute(f"ALTER TABLE api_keys ADD COLUMN {column} {declaration}")
    conn.execute("CREATE INDEX IF NOT EXISTS api_keys_by_change ON api_keys (changed_seq)")


def _next_change(conn: sqlite3.Connection) -> int:
    """The next position of the change feed (inside the write transaction that makes the change)."""
    conn.execute("UPDATE key_feed SET seq = seq + 1 WHERE id = 1")
    row = conn.execute("SELECT seq FROM key_feed WHERE id = 1").fetchone()
    return int(row[0])

_COLUMNS = "key_id, user, tenant, name, display, created_at, revoked_at"


def _record(row: tuple[Any, ...]) -> ApiKey:
    return ApiKey(*row)


class SqliteKeyStore:
    """API keys in a local SQLite file (may be the credit store's file)."""

    name = "sqlite"

    def __init__(
        self, path: str | Path = "ragproxy-credits.sqlite3", *, clock: Callable[[], float] = time.time
    ) -> None:
        self._db = SqliteWorker(path, SCHEMA, migrate=_migrate)
        self.clock = clock

    async def close(self) -> None:
        await self._db.close()

    async def create(self, user: str, tenant: str = "default", name: str = "") -> CreatedKey:
        plaintext = new_key()
        record = ApiKey(new_key_id(), user, tenant, name, display_of(plaintext), self.clock())

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO api_keys (key_hash, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                (key_hash(plaintext), record.key_id, user, tenant, name, record.display, record.created_at),
            )

        await self._db.transaction(work)
        return CreatedKey(record, plaintext)

    async def list(
        self, *, user: str | None = None, tenant: str | None = None, include_revoked: bool = False
    ) -> list[ApiKey]:
        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, key_id").fetchall()

        return [
            key
            for key in map(_record, await self._db.transaction(work, write=False))
            if matches(key, user, tenant, include_revoked)
        ]

    async def revoke(self, key_id: str) -> bool:
        now = self.clock()

        def work(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (now, key_id)
            )
            if cursor.rowcount != 1:
                return False
            conn.execute("UPDATE api_keys SET changed_seq = ? WHERE key_id = ?", (_next_change(conn), key_id))
            return True

        return await self._db.transaction(work)

    async def lookup(self, presented: str) -> ApiKey | None:
        digest = key_hash(presented)

        def work(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(
                f"SELECT {_COLUMNS} FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL", (digest,)
            ).fetchone()
            return row

        row = await self._db.transaction(work, write=False)
        return None if row is None else _record(row)

    async def changes(self, since: int | None) -> KeyChanges:
        def work(conn: sqlite3.Connection) -> tuple[int, list[tuple[Any, ...]]]:
            seq = int(conn.execute("SELECT seq FROM key_feed WHERE id = 1").fetchone()[0])
            if since is None:
                return seq, []
            return seq, conn.execute(
                f"SELECT key_hash, {_COLUMNS} FROM api_keys WHERE changed_seq > ? ORDER BY changed_seq",
                (since,)).fetchall()

        seq, rows = await self._db.transaction(work, write=False)
        return KeyChanges(seq, [(str(row[0]), _record(row[1:])) for row in rows])
