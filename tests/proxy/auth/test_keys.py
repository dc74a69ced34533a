"""What every API key store must do (run against SQLite and Redis)."""

from __future__ import annotations

from proxy.auth.keys import KEY_PREFIX, KeyStore, key_hash


async def test_create_returns_the_plaintext_once_and_lookup_finds_it(key_store: KeyStore) -> None:
    created = await key_store.create("ann", "acme", name="laptop")
    assert created.plaintext.startswith(KEY_PREFIX) and len(created.plaintext) >= 40
    found = await key_store.lookup(created.plaintext)
    assert found == created.record
    assert (found.user, found.tenant, found.name, found.active) == ("ann", "acme", "laptop", True)
    assert created.plaintext not in repr(found)
    assert created.record.display.startswith(created.plaintext[:8])


async def test_unknown_keys_are_not_found(key_store: KeyStore) -> None:
    created = await key_store.create("ann")
    assert await key_store.lookup(created.plaintext + "x") is None
    assert await key_store.lookup(key_hash(created.plaintext)) is None  # the stored hash is not a key
    assert await key_store.lookup("") is None


async def test_revoked_keys_stop_working(key_store: KeyStore) -> None:
    kept, revoked = await key_store.create("ann"), await key_store.create("ann")
    assert await key_store.revoke(revoked.record.key_id) is True
    assert await key_store.revoke(revoked.record.key_id) is False
    assert await key_store.revoke("key_nope") is False
    assert await key_store.lookup(revoked.plaintext) is None
    assert await key_store.lookup(kept.plaintext) is not None
    listed = await key_store.list(include_revoked=True)
    assert [key.key_id for key in listed] == [kept.record.key_id, revoked.record.key_id]
    assert listed[1].revoked_at is not None and not listed[1].active


async def test_list_filters(key_store: KeyStore) -> None:
    a = await key_store.create("ann", "acme")
    b = await key_store.create("bob", "acme")
    c = await key_store.create("cy", "zeta")
    assert [k.key_id for k in await key_store.list()] == [a.record.key_id, b.record.key_id, c.record.key_id]
    assert [k.user for k in await key_store.list(tenant="acme")] == ["ann", "bob"]
    assert [k.user for k in await key_store.list(user="cy")] == ["cy"]
    await key_store.revoke(b.record.key_id)
    assert [k.user for k in await key_store.list(tenant="acme")] == ["ann"]


async def test_revocations_are_on_the_change_feed(key_store: KeyStore) -> None:
    start = (await key_store.changes(None)).seq
    kept, revoked = await key_store.create("ann"), await key_store.create("bob")
    assert (await key_store.changes(start)).keys == [], "a new key is no change to a key anyone remembers"
    await key_store.revoke(revoked.record.key_id)
    changes = await key_store.changes(start)
    assert [(digest, key.key_id, key.active) for digest, key in changes.keys] == [
        (key_hash(revoked.plaintext), revoked.record.key_id, False)]
    assert changes.seq > start
    again = await key_store.changes(changes.seq)
    assert (again.seq, again.keys) == (changes.seq, [])
    assert kept.record.key_id not in {key.key_id for _, key in changes.keys}
