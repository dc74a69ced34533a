"""The keys a replica remembers, kept true by the key store's change feed (SQLite and Redis stores)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.auth.keys import KeyStore, key_hash
from proxy.auth.known_keys import KnownKeys
from proxy.auth.sqlite_keys import SqliteKeyStore


async def test_a_revocation_reaches_a_remembered_key_through_the_feed(key_store: KeyStore) -> None:
    now = [100.0]
    known = KnownKeys(ttl_s=30, trust_s=60, clock=lambda: now[0])
    await known.sync(key_store)
    ann, bob = await key_store.create("ann"), await key_store.create("bob")
    for created in (ann, bob):
        found = await key_store.lookup(created.plaintext)
        assert found is not None
        known.remember(key_hash(created.plaintext), found)
    await key_store.revoke(ann.record.key_id)
    remembered = known.fresh(key_hash(ann.plaintext))
    assert remembered is not None and remembered.key.active, "not applied before the feed is read"
    await known.sync(key_store)
    remembered = known.fresh(key_hash(ann.plaintext))
    assert remembered is not None and not remembered.key.active
    kept = known.fresh(key_hash(bob.plaintext))
    assert kept is not None and kept.key.active


async def test_trust_in_an_outage_lasts_as_long_as_the_last_confirmation_allows(key_store: KeyStore) -> None:
    now = [100.0]
    known = KnownKeys(ttl_s=30, trust_s=60, clock=lambda: now[0])
    created = await key_store.create("ann")
    found = await key_store.lookup(created.plaintext)
    assert found is not None
    digest = key_hash(created.plaintext)
    known.remember(digest, found)
    now[0] += 31
    assert known.fresh(digest) is None and known.trusted(digest) is not None
    now[0] += 20
    await known.sync(key_store)  # a read of the feed confirms it as a lookup would
    now[0] += 50  # 101 s after the lookup, 50 s after the read of the feed
    assert known.trusted(digest) is not None
    now[0] += 11
    assert known.trusted(digest) is None


async def test_a_feed_that_went_back_forgets_every_remembered_key(tmp_path: Path) -> None:
    store = SqliteKeyStore(tmp_path / "keys.sqlite3")
    try:
        known = KnownKeys()
        created = await store.create("ann")
        await store.revoke((await store.create("bob")).record.key_id)
        await known.sync(store)
        found = await store.lookup(created.plaintext)
        assert found is not None
        known.remember(key_hash(created.plaintext), found)
        with sqlite3.connect(tmp_path / "keys.sqlite3") as conn:
            conn.execute("UPDATE key_feed SET seq = 0")
        await known.sync(store)
        assert len(known) == 0
    finally:
        await store.close()


async def test_a_key_file_of_an_earlier_version_gains_the_feed(tmp_path: Path) -> None:
    path = tmp_path / "credits.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE api_keys (key_id TEXT PRIMARY KEY, key_hash TEXT NOT NULL UNIQUE, user TEXT NOT "
                     "NULL, tenant TEXT NOT NULL, name TEXT NOT NULL, display TEXT NOT NULL, created_at REAL NOT "
                     "NULL, revoked_at REAL)")
        conn.execute("INSERT INTO api_keys VALUES ('key_old', ?, 'ann', 'acme', '', 'rpk_x', 1.0, NULL)",
                     (key_hash("rpk_old"),))
    store = SqliteKeyStore(path)
    try:
        start = (await store.changes(None)).seq
        found = await store.lookup("rpk_old")
        assert found is not None and found.user == "ann"
        assert await store.revoke("key_old")
        assert [key.key_id for _, key in (await store.changes(start)).keys] == ["key_old"]
    finally:
        await store.close()
