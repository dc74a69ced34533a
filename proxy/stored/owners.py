"""Who made each stored response: the tenant whose request created it, and the LLM replica that keeps it.

A stored Responses API object (``store`` true, the API's default) is a resource of the upstream, named by its id
and kept under the proxy's own upstream key: every tenant's request reaches the upstream with the same
credentials, so the upstream cannot tell whose a response is. The proxy remembers it instead: when a response is
made through it, ``id → (tenant, replica)`` is recorded for ``upstreams.response_retention_s`` (how long the
upstream keeps it; OpenAI: 30 days). Fetching, deleting, listing the input items of or cancelling a response by
id, and continuing one (``previous_response_id``), are then allowed only for that tenant and sent to that replica
(:mod:`proxy.stored.stages`). An id the proxy does not know — never made through it, expired, deleted —
is answered as the upstream answers an id that does not exist.

Stores (one contract, :class:`ResponseOwners`):

- :class:`SqliteResponseOwners` in embedded mode: ``<data_dir>/responses.sqlite3``, so a restart keeps every
  tenant's access to its responses (the cold tier keeps their cached copies across restarts too);
- :class:`RedisResponseOwners` in shared mode: ``<prefix>:resp:<id>`` strings with the retention as their TTL on the
  shared Redis, so every proxy replica knows every response. A Redis that lost its data (keys or credits in Redis
  watch for it: :mod:`proxy.stores.redis_wipe`) is not believed: while it is known, every operation is refused,
  and a record is confirmed by reading the sentinel again once written — so an owner recorded in the moment before
  the watch noticed is not taken as kept, but kept in memory and recorded again once the data is back
  (:mod:`proxy.stored.stages`). Without this, a response made during a wipe was recorded only in the empty Redis,
  and the restore made it 404 for its owner for good.

A store that cannot answer raises :class:`OwnersUnavailable`: a request naming a response id is then refused with
503 (``Retry-After``) rather than sent upstream unchecked. Recording fails open (a warning): the response was
made and is answered; only fetching it by id through the proxy will not work.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
import redis.exceptions

from proxy.core.redis_settings import RedisSettings
from proxy.stores.redis_wipe import WipeWatch
from proxy.stores.sqlite_worker import SqliteWorker
from proxy.stores.unavailable import StoreUnavailable
from tiers.redis_connect import RedisClient

_REDIS = RedisSettings()  # the defaults, defined once there


class OwnersUnavailable(Exception):
    """The store of response owners did not answer."""


@dataclass(frozen=True, slots=True)
class ResponseOwner:
    """The tenant that made a stored response and the label of the LLM replica that keeps it."""

    tenant: str
    replica: str


class ResponseOwners(Protocol):
    """Response id → its owner, each record kept ``ttl_s`` seconds."""

    async def record(self, response_id: str, owner: ResponseOwner) -> None: ...

    async def owner(self, response_id: str) -> ResponseOwner | None: ...

    async def forget(self, response_id: str) -> None: ...

    async def close(self) -> None: ...


SCHEMA = """
CREATE TABLE IF NOT EXISTS response_owners (
    response_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    replica TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS response_owners_expiry ON response_owners (expires_at);
"""


class SqliteResponseOwners:
    """Owners in a local SQLite file (embedded mode); expired records are purged every ``purge_every`` records."""

    def __init__(self, path: str | Path, *, ttl_s: float, purge_every: int = 1000,
                 clock: Callable[[], float] = time.time) -> None:
        self._db = SqliteWorker(path, SCHEMA, synchronous="NORMAL")
        self.ttl_s = ttl_s
        self.purge_every = purge_every
        self.clock = clock
        self._recorded = 0

    async def _run(self, work: Callable[[sqlite3.Connection], object], *, write: bool = True) -> object:
        try:
            return await self._db.transaction(work, write=write)
        except StoreUnavailable as exc:  # the worker's name for any database failure
            raise OwnersUnavailable(str(exc)) from exc

    async def record(self, response_id: str, owner: ResponseOwner) -> None:
        now = self.clock()
        self._recorded += 1
        purge = self._recorded % self.purge_every == 0

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR REPLACE INTO response_owners VALUES (?, ?, ?, ?)",
                         (response_id, owner.tenant, owner.replica, now + self.ttl_s))
            if purge:
                conn.execute("DELETE FROM response_owners WHERE expires_at <= ?", (now,))

        await self._run(work)

    async def owner(self, response_id: str) -> ResponseOwner | None:
        now = self.clock()

        def work(conn: sqlite3.Connection) -> tuple[str, str] | None:
            row: tuple[str, str] | None = conn.execute(
                "SELECT tenant, replica FROM response_owners WHERE response_id = ? AND expires_at > ?",
                (response_id, now)).fetchone()
            return row

        row = await self._run(work, write=False)
        return ResponseOwner(*row) if isinstance(row, tuple) else None

    async def forget(self, response_id: str) -> None:
        await self._run(lambda conn: conn.execute("DELETE FROM response_owners WHERE response_id = ?",
                                                  (response_id,)))

    async def close(self) -> None:
        await self._db.close()


class RedisResponseOwners:
    """Owners on the shared Redis (shared mode): one string per response, expiring with the retention."""

    def __init__(self, client: RedisClient, *, ttl_s: float, prefix: str = _REDIS.prefix) -> None:
        self.client = client
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.prefix = f"{prefix}:resp:"
        self.wipe: WipeWatch | None = None
        """Set: a Redis that lost its data is not believed (see the module docstring)."""

    @contextlib.asynccontextmanager
    async def _redis(self) -> AsyncIterator[None]:
        """Redis failures, and a Redis known to have lost its data, as :class:`OwnersUnavailable`."""
        try:
            if self.wipe is not None:
                self.wipe.refuse()
            yield
        except (redis.exceptions.RedisError, OSError, StoreUnavailable) as exc:
            raise OwnersUnavailable(f"response owners (Redis): {exc}") from exc

    async def record(self, response_id: str, owner: ResponseOwner) -> None:
        value = orjson.dumps([owner.tenant, owner.replica])
        async with self._redis():
            await self.client.set(self.prefix + response_id, value, px=self.ttl_ms)
            if self.wipe is not None:
                await self.wipe.confirm()  # recorded in a Redis that lost its data: not kept

    async def owner(self, response_id: str) -> ResponseOwner | None:
        async with self._redis():
            raw = await self.client.get(self.prefix + response_id)
            if raw is None and self.wipe is not None:
                await self.wipe.confirm()  # unknown to an empty Redis is not unknown
        if raw is None:
            return None
        tenant, replica = orjson.loads(raw)
        return ResponseOwner(str(tenant), str(replica))

    async def forget(self, response_id: str) -> None:
        async with self._redis():
            await self.client.delete(self.prefix + response_id)

    async def close(self) -> None:
        """The client belongs to shared mode, which closes it."""
