"""The store conformance suite again, for the Redis store as shared mode configures it: a budget, lz4 with the
built-in dictionary, several shards, tombstones kept (values are stored compressed, so byte counts are not the
callers')."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.tiers.test_store_conformance import *  # noqa: F403  (the suite, collected again here)
from tests.tiers.test_store_conformance import Backend
from tiers.redis_store import RedisStore


@pytest.fixture
async def backend(redis_url: str) -> AsyncIterator[Backend]:
    store = RedisStore(redis_url, prefix="conformance-shared", max_bytes=64 * 1024 * 1024, shards=4, compress=True,
                       keep_evicted_s=1.0)
    yield Backend(store, asyncio.sleep, exact_bytes=False)
    await store.close()
