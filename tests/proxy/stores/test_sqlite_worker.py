"""The credit stores' SQLite connection, opened by several processes at once (replicas sharing one file)."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

from proxy.stores.sqlite_worker import SqliteWorker

SCHEMA = "CREATE TABLE IF NOT EXISTS entries (n INTEGER);"


def _write(path: str, count: int) -> str:
    """One process: open the worker on ``path`` and write ``count`` rows; ``ok`` or the error."""

    async def run() -> str:
        worker = SqliteWorker(path, SCHEMA, synchronous="FULL", busy_timeout_s=2.0)
        try:
            for _ in range(count):
                await worker.transaction(lambda conn: conn.execute("INSERT INTO entries VALUES (1)"))
            return "ok"
        except Exception as error:  # reported, so the test names what failed
            return repr(error)
        finally:
            await worker.close()

    return asyncio.run(run())


def test_processes_opening_a_new_database_together_all_get_in(tmp_path: Path) -> None:
    """SQLite answers the switch of a new file to WAL with "database is locked" at once, without waiting, while
    another process converts it: before the switch was retried, about 1 round in 20 of four processes opening a
    new file together lost one of them (a 503 for its first request)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with context.Pool(4) as pool:
        for round_ in range(100):
            path = str(tmp_path / f"credits-{round_}.sqlite3")
            results = pool.starmap(_write, [(path, 20)] * 4)
            assert results == ["ok"] * 4, (round_, results)
