"""Credit stores under test: every backend, through one parameter list."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.sqlite_store import SqliteCreditStore
from proxy.credits.store import CreditStore

BACKENDS = ["sqlite", "redis"]


def make_credit_store(backend: str, tmp_path: Path, redis_url: str) -> CreditStore:
    if backend == "sqlite":
        return SqliteCreditStore(tmp_path / "credits.sqlite3")
    return RedisCreditStore.from_url(redis_url, timeout_s=15.0)  # a shared, noisy test machine


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def credit_store(backend: str, tmp_path: Path, redis_url: str) -> AsyncIterator[CreditStore]:
    store = make_credit_store(backend, tmp_path, redis_url)
    yield store
    await store.close()
