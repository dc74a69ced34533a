"""API keys, and the limits of users and tenants, in the embedded SQLite database (tables ``api_keys`` and
``scope_limits``; see :mod:`proxy.auth.keys`).

The change feed: every change after a key's creation, and every change of a user's or tenant's limits, stamps the
row with the next position of ``key_feed`` (one row) in ``changed_seq``; :meth:`SqliteKeyStore.changes` reads the
rows stamped after a position. Each change is one write transaction, so concurrent admin calls never lose one
another's change.
"""

from __future__ import annotations

import builtins
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from proxy.auth.keys import (
    ApiKey,
    CreatedKey,
    KeyChanges,
    check_scope_kind,
    display_of,
    key_hash,
    limits_from,
    limits_json,
    matches,
    new_key,
    new_key_id,
    quota_of,
)
from proxy.core.handoffs import NO_LIMITS, Limits, Quota, Scope
from proxy.stores.sqlite_worker import SqliteWorker

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
    changed_seq INTEGER NOT NULL DEFAULT 0,
    expires_at REAL,
    limits TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS scope_limits (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    limits TEXT NOT NULL,
    changed_seq INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
);
CREATE INDEX IF NOT EXISTS scope_limits_by_change ON scope_limits (changed_seq);
CREATE TABLE IF NOT EXISTS key_feed (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT OR IGNORE INTO key_feed VALUES (1, 0);
"""

_ADDED_COLUMNS = {"changed_seq": "INTEGER NOT NULL DEFAULT 0", "expires_at": "REAL",
                  "limits": "TEXT NOT NULL DEFAULT '{}'"}
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


_COLUMNS = "key_id, user, tenant, name, display, created_at, revoked_at, expires_at, limits"


def _record(row: tuple[Any, ...]) -> ApiKey:
    key_id, user, tenant, name, display, created_at, revoked_at, expires_at, limits = row
    return ApiKey(key_id, user, tenant, name, display, created_at, revoked_at, expires_at,
                  limits_from(orjson.loads(limits)))


def _limits_text(limits: Limits) -> str:
    return orjson.dumps(limits_json(limits)).decode()


class SqliteKeyStore:
    """API keys in a local SQLite file (may be the credit store's file)."""

    name = "sqlite"

    def __init__(
        self, path: str | Path = "ragproxy-credits.sqlite3", *, clock: Callable[[], float] = time.time
    ) -> None:
        self._db = SqliteWorker(path, SCHEMA, synchronous="FULL", migrate=_migrate)  # a key survives a power cut
        self.clock = clock

    async def close(self) -> None:
        await self._db.close()

    async def create(self, user: str, tenant: str = "default", name: str = "", *, expires_at: float | None = None,
                     limits: Limits = NO_LIMITS) -> CreatedKey:
        plaintext = new_key()
        record = ApiKey(new_key_id(), user, tenant, name, display_of(plaintext), self.clock(), expires_at=expires_at,
                        limits=limits)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO api_keys (key_hash, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (key_hash(plaintext), record.key_id, user, tenant, name, record.display, record.created_at,
                 expires_at, _limits_text(limits)),
            )

        await self._db.transaction(work)
        return CreatedKey(record, plaintext)

    async def get(self, key_id: str) -> ApiKey | None:
        def work(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ?",
                                                       (key_id,)).fetchone()
            return row

        row = await self._db.transaction(work, write=False)
        return None if row is None else _record(row)

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

    async def update(self, key_id: str, edit: Callable[[ApiKey], ApiKey]) -> ApiKey | None:
        def work(conn: sqlite3.Connection) -> ApiKey | None:
            row = conn.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ? AND revoked_at IS NULL",
                               (key_id,)).fetchone()
            if row is None:
                return None
            key = _record(row)
            wanted = edit(key)
            changed = replace(key, name=wanted.name, expires_at=wanted.expires_at, limits=wanted.limits)
            conn.execute("UPDATE api_keys SET name = ?, expires_at = ?, limits = ?, changed_seq = ? WHERE key_id = ?",
                         (changed.name, changed.expires_at, _limits_text(changed.limits), _next_change(conn),
                          key_id))
            return changed

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

    async def scope_limits(self, kind: str, name: str) -> Limits:
        check_scope_kind(kind)

        def work(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(
                "SELECT limits FROM scope_limits WHERE kind = ? AND name = ?", (kind, name)).fetchone()
            return row

        row = await self._db.transaction(work, write=False)
        return Limits() if row is None else limits_from(orjson.loads(row[0]))

    async def set_scope_limits(self, kind: str, name: str, edit: Callable[[Limits], Limits]) -> Limits:
        check_scope_kind(kind)

        def work(conn: sqlite3.Connection) -> Limits:
            row = conn.execute("SELECT limits FROM scope_limits WHERE kind = ? AND name = ?", (kind, name)).fetchone()
            limits = edit(Limits() if row is None else limits_from(orjson.loads(row[0])))
            conn.execute("INSERT OR REPLACE INTO scope_limits VALUES (?, ?, ?, ?)",
                         (kind, name, _limits_text(limits), _next_change(conn)))
            return limits

        return await self._db.transaction(work)

    async def limited_scopes(self) -> builtins.list[Scope]:
        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute("SELECT kind, name, limits FROM scope_limits ORDER BY kind, name").fetchall()

        scopes = [Scope(kind, name, limits_from(orjson.loads(text)))
                  for kind, name, text in await self._db.transaction(work, write=False)]
        return [scope for scope in scopes if scope.limits.limited]

    async def quota(self, key: ApiKey) -> Quota:
        def work(conn: sqlite3.Connection) -> dict[str, Limits]:
            rows = conn.execute("SELECT kind, limits FROM scope_limits WHERE (kind = 'user' AND name = ?) OR "
                                "(kind = 'tenant' AND name = ?)", (key.user, key.tenant)).fetchall()
            return {kind: limits_from(orjson.loads(text)) for kind, text in rows}

        found = await self._db.transaction(work, write=False)
        return quota_of(key, found.get("user", Limits()), found.get("tenant", Limits()))

    async def changes(self, since: int | None) -> KeyChanges:
        def work(conn: sqlite3.Connection) -> tuple[int, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
            seq = int(conn.execute("SELECT seq FROM key_feed WHERE id = 1").fetchone()[0])
            if since is None:
                return seq, [], []
            keys = conn.execute(f"SELECT key_hash, {_COLUMNS} FROM api_keys WHERE changed_seq > ? "
                                "ORDER BY changed_seq", (since,)).fetchall()
            scopes = conn.execute("SELECT kind, name, limits FROM scope_limits WHERE changed_seq > ? "
                                  "ORDER BY changed_seq", (since,)).fetchall()
            return seq, keys, scopes

        seq, keys, scopes = await self._db.transaction(work, write=False)
        return KeyChanges(seq, [(str(row[0]), _record(row[1:])) for row in keys],
                          [Scope(kind, name, limits_from(orjson.loads(text))) for kind, name, text in scopes])
