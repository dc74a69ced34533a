"""The stores of response owners: SQLite (embedded) and Redis (shared), one contract; expiry; failures."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.core.endpoints import COMPACT, INPUT_TOKENS, RESPONSE_CANCEL, RESPONSE_INPUT_ITEMS, RESPONSE_RETRIEVE
from proxy.stored.owners import (
    OwnersUnavailable,
    RedisResponseOwners,
    ResponseOwner,
    ResponseOwners,
    SqliteResponseOwners,
)
from tests.support.processes import free_port

ANN = ResponseOwner("acme", "replica-a")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "redis"])
async def owners(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ResponseOwners]:
    if request.param == "sqlite":
        store: ResponseOwners = SqliteResponseOwners(tmp_path / "responses.sqlite3", ttl_s=60)
    else:
        url = request.getfixturevalue("redis_url")
        store = RedisResponseOwners(aioredis.Redis.from_url(url), ttl_s=60, prefix="t")
    yield store
    await store.close()
    if isinstance(store, RedisResponseOwners):
        await store.client.aclose()


async def test_record_look_up_forget(owners: ResponseOwners) -> None:
    assert await owners.owner("resp_1") is None
    await owners.record("resp_1", ANN)
    assert await owners.owner("resp_1") == ANN
    await owners.forget("resp_1")
    assert await owners.owner("resp_1") is None


async def test_sqlite_records_expire_and_survive_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "responses.sqlite3"
    first = SqliteResponseOwners(path, ttl_s=60, clock=clock)
    await first.record("resp_old", ANN)
    await first.close()
    second = SqliteResponseOwners(path, ttl_s=60, purge_every=1, clock=clock)
    assert await second.owner("resp_old") == ANN, "a restarted proxy still knows whose it is"
    clock.now += 61
    assert await second.owner("resp_old") is None, "past the upstream's retention"
    await second.record("resp_new", ANN)  # recording purges what expired (here every record)
    assert await second._db.transaction(lambda c: c.execute("SELECT COUNT(*) FROM response_owners").fetchone()[0],
                                        write=False) == 1
    await second.close()


async def test_redis_records_expire_with_the_retention(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    owners = RedisResponseOwners(client, ttl_s=30, prefix="t")
    await owners.record("resp_1", ANN)
    assert 29_000 < await client.pttl("t:resp:resp_1") <= 30_000
    await client.aclose()


async def test_an_unreachable_redis_is_unavailable_not_unknown() -> None:
    client = aioredis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    owners = RedisResponseOwners(client, ttl_s=30)
    with pytest.raises(OwnersUnavailable):
        await owners.owner("resp_1")
    with pytest.raises(OwnersUnavailable):
        await owners.record("resp_1", ANN)
    await client.aclose()


def test_which_paths_name_a_response() -> None:
    assert RESPONSE_RETRIEVE.path.match("/v1/responses/resp_1") == {"response_id": "resp_1"}
    assert RESPONSE_INPUT_ITEMS.path.match("/v1/responses/resp_1/input_items") == {"response_id": "resp_1"}
    assert RESPONSE_CANCEL.path.match("/v1/responses/resp_1/cancel") == {"response_id": "resp_1"}
    assert RESPONSE_RETRIEVE.path.match("/v1/responses/input_tokens") is None, "not a response id"
    assert INPUT_TOKENS.names is None and COMPACT.names is None
    assert RESPONSE_RETRIEVE.path.match("/v1/chat/completions") is None
