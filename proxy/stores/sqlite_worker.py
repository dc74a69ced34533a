"""One SQLite connection owned by one worker thread, so no blocking call runs on the event loop.

Written here rather than taken from aiosqlite because every credit operation is a whole read-check-write
transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) that must run without interleaving: handing one plain function
to the thread that owns the connection gives exactly that, with no await between the check and the write. The
database is in WAL mode, with the ``synchronous`` level its owner names (``FULL``: a committed entry survives a power
cut; ``NORMAL``: a crash of the process) and a busy timeout, so several processes on one host may share the file.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from proxy.stores.unavailable import StoreUnavailable

T = TypeVar("T")


class SqliteWorker:
    """Runs functions of a connection in its own thread, each inside one immediate transaction."""

    def __init__(
        self, path: str | Path, schema: str, *, synchronous: str, busy_timeout_s: float = 5.0,
        migrate: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """``migrate``: brings a file made by an earlier version up to ``schema`` (columns it lacks), run in a write
        transaction after the schema."""
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        self._synchronous = synchronous.upper()
        self.path = str(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="credits-sqlite")
        self._busy_timeout_ms = int(busy_timeout_s * 1000)
        self._schema = schema
        self._migrate = migrate
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
                self._use_wal(conn)
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
                conn.executescript(self._schema)
                if self._migrate is not None:
                    conn.execute("BEGIN IMMEDIATE")
                    self._migrate(conn)
                    conn.execute("COMMIT")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL, waiting out other processes doing the same: SQLite answers that switch "database
        is locked" at once, without its busy handler, while another connection converts a new file (seen with
        several processes opening one new database together), so it is retried within the busy timeout."""
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _in_transaction(self, work: Callable[[sqlite3.Connection], T], write: bool) -> T:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = work(conn)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def transaction(self, work: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        """Run ``work(conn)`` atomically in the worker thread (``write=False``: a read that takes no write lock)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._in_transaction, work, write)
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk full, I/O error
            raise StoreUnavailable(f"credit database {self.path}: {exc}") from exc

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=True)
