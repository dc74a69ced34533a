"""Backend-specific promises: the SQLite ledger refuses edits; the Redis reaper index never outlives a hold."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import redis

from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.sqlite_store import SqliteCreditStore
from proxy.credits.store import ChargeDetails

CREDIT = 1_000_000


async def test_the_sqlite_ledger_is_append_only(tmp_path: Path) -> None:
    store = SqliteCreditStore(tmp_path / "c.sqlite3")
    await store.top_up("ann", CREDIT)
    await store.close()
    conn = sqlite3.connect(tmp_path / "c.sqlite3")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE ledger SET amount = 0")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM ledger")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE accounts SET available = -1")
    conn.close()


async def test_the_redis_deadline_index_holds_exactly_the_open_reservations(redis_url: str) -> None:
    store = RedisCreditStore.from_url(redis_url, prefix="t")
    raw = redis.Redis.from_url(redis_url)
    try:
        await store.top_up("ann", 10 * CREDIT)
        for rid in ("a", "b", "c", "d"):
            await store.reserve(rid, "ann", CREDIT, 60, now=1000.0)
        await store.reserve("too-big", "ann", 100 * CREDIT, 60, now=1000.0)
        assert sorted(raw.zrange("t:deadlines", 0, -1)) == [b"ann a", b"ann b", b"ann c", b"ann d"]
        await store.settle("a", "ann", CREDIT, ChargeDetails())
        await store.release("b", "ann")
        assert sorted(raw.zrange("t:deadlines", 0, -1)) == [b"ann c", b"ann d"]
        assert await store.reap_expired(now=1061.0) == 2
        assert raw.zcard("t:deadlines") == 0
        assert raw.hlen("t:{ann}:hold-amounts") == 0 and raw.zcard("t:{ann}:holds") == 0
    finally:
        raw.close()
        await store.close()
