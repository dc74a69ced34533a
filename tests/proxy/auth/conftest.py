"""Key stores under test: every backend, through one parameter list."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.auth.keys import KeyStore
from proxy.auth.redis_keys import RedisKeyStore
from proxy.auth.sqlite_keys import SqliteKeyStore


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def key_store(backend: str, tmp_path: Path, redis_url: str) -> AsyncIterator[KeyStore]:
    store: KeyStore = (
        SqliteKeyStore(tmp_path / "credits.sqlite3") if backend == "sqlite" else RedisKeyStore.from_url(redis_url)
    )
    yield store
    await store.close()
