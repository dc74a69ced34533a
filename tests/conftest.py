"""Session-wide fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.support.processes import RedisServer

pytest_plugins = ["tests.support.doubles_fixtures"]

# Property tests check results, not speed: on a shared machine a per-example time limit only adds flaky failures.
settings.register_profile("results-not-speed", deadline=None)
settings.load_profile("results-not-speed")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free port, for the whole session."""
    server = RedisServer.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A fresh, empty database on the session's Redis (flushed after each test; never the machine's 6379)."""
    import redis

    client = redis.Redis(port=redis_server.port)
    client.flushall()
    yield redis_server.url
    client.flushall()
    client.close()
