"""Where the rate-limit buckets and budget spend of keys, users and tenants are counted (the decisions are
:mod:`proxy.rate_limits.decisions`).

- :class:`LocalLimitCounters` (embedded mode): the buckets in this process's memory, the budgets' spend in the
  embedded SQLite database (``budget_spend``, beside the keys) so a restart does not hand out a budget again; both
  held in memory at most for ``max_scopes`` scopes (least recently counted forgotten first). Only keys, users and
  tenants an operator gave limits are counted, so a client cannot add scopes.
- :class:`RedisLimitCounters` (shared mode): every replica counts into the same Redis. A scope's buckets are one hash,
  ``<prefix>:{rl:<scope>}`` (fields ``r``, ``t``: the levels, ``at``: when they were last drained, epoch ms), taken
  and adjusted by one Lua script each, so the check and the count are one atomic step across replicas; it expires
  once both buckets would be empty. A budget window's spend is ``<prefix>:{rl:<scope>}:spent:<window start>``
  (``INCRBY``), expiring a day after its window ends (a budget without a period: never). While Redis cannot be reached
  or is known to have lost its data (:mod:`proxy.stores.redis_wipe`), the replica counts in its own memory
  instead (each replica then admits up to the limits by itself; spend counted meanwhile stays local), logged once
  a minute.

Clocks: ``now`` is the caller's wall clock (epoch seconds); replicas need clocks in sync to well within a second.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import quote

from redis.exceptions import RedisError

from proxy.core.handoffs import Scope
from proxy.rate_limits.decisions import Level, Window, adjusted, drained, empty_after_s, fits, taken
from proxy.stores.redis_client import RedisClient
from proxy.stores.redis_wipe import WipeWatch
from proxy.stores.sqlite_worker import SqliteWorker
from proxy.stores.unavailable import StoreUnavailable

log = logging.getLogger("ragproxy.credits")

MAX_SCOPES = 100_000
"""Scopes whose buckets and spend one process holds in memory at most."""
SPENT_KEPT_S = 86_400
"""How long a budget window's spend is kept after the window ends (shown on the dashboard meanwhile)."""

T = TypeVar("T")


class LimitCounters(Protocol):
    """The buckets and budget spend of limited scopes."""

    async def take(self, scope: Scope, tokens: int, now: float) -> tuple[bool, Level]:
        """Count one request asking for ``tokens`` against ``scope``'s buckets if it fits: ``(True, the level
        after)``, else nothing changes: ``(False, the level now)``."""

    async def adjust(self, scope: Scope, requests: float, tokens: float, now: float) -> None:
        """Add ``requests`` and ``tokens`` to ``scope``'s buckets (negative: give back), never below 0."""

    async def level(self, scope: Scope, now: float) -> Level:
        """``scope``'s buckets now."""

    async def spent(self, scope: Scope, window: Window) -> int:
        """Micro-credits charged to ``scope`` in ``window``."""

    async def spend(self, scope: Scope, window: Window, amount: int) -> None:
        """Add ``amount`` micro-credits to what ``scope`` was charged in ``window``."""

    async def close(self) -> None: ...


class _Buckets:
    """Buckets in memory: scope id → (level, when it was drained), least recently used first."""

    def __init__(self, max_scopes: int) -> None:
        self.max_scopes = max_scopes
        self._levels: OrderedDict[str, tuple[Level, float]] = OrderedDict()

    def now(self, scope: Scope, now: float) -> Level:
        level, at = self._levels.get(scope.id, (Level(), now))
        limits = scope.limits
        return Level(drained(level.requests, limits.rpm_limit, now - at), drained(level.tokens, limits.tpm_limit,
                                                                                  now - at))

    def put(self, scope: Scope, level: Level, now: float) -> None:
        if empty_after_s(level, scope.limits) <= 0:
            self._levels.pop(scope.id, None)
            return
        self._levels[scope.id] = (level, now)
        self._levels.move_to_end(scope.id)
        while len(self._levels) > self.max_scopes:
            self._levels.popitem(last=False)

    def take(self, scope: Scope, tokens: int, now: float) -> tuple[bool, Level]:
        level = self.now(scope, now)
        if not fits(level, scope.limits, tokens):
            return False, level
        after = taken(level, scope.limits, tokens)
        self.put(scope, after, now)
        return True, after

    def adjust(self, scope: Scope, requests: float, tokens: float, now: float) -> None:
        self.put(scope, adjusted(self.now(scope, now), requests, tokens), now)


_BUDGET_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget_spend (
    scope TEXT NOT NULL,
    window_start REAL NOT NULL,
    window_end REAL NOT NULL,
    spent INTEGER NOT NULL,
    PRIMARY KEY (scope, window_start)
);
CREATE INDEX IF NOT EXISTS budget_spend_by_end ON budget_spend (window_end);
"""


class LocalLimitCounters:
    """Counters of one process (embedded mode; see the module docstring): the budgets' spend kept in SQLite at
    ``path`` when given."""

    def __init__(self, path: str | Path | None = None, *, max_scopes: int = MAX_SCOPES,
                 clock: Callable[[], float] = time.time) -> None:
        self._buckets = _Buckets(max_scopes)
        self._spent: OrderedDict[tuple[str, float], int] = OrderedDict()
        self.max_scopes = max_scopes
        self.clock = clock
        self._db = SqliteWorker(path, _BUDGET_SCHEMA, synchronous="NORMAL") if path is not None else None
        self._spends = 0

    async def take(self, scope: Scope, tokens: int, now: float) -> tuple[bool, Level]:
        return self._buckets.take(scope, tokens, now)

    async def adjust(self, scope: Scope, requests: float, tokens: float, now: float) -> None:
        self._buckets.adjust(scope, requests, tokens, now)

    async def level(self, scope: Scope, now: float) -> Level:
        return self._buckets.now(scope, now)

    async def spent(self, scope: Scope, window: Window) -> int:
        known = self._spent.get((scope.id, window.start))
        if known is not None:
            return known
        spent = 0
        if self._db is not None:
            def work(conn: sqlite3.Connection) -> int:
                row = conn.execute("SELECT spent FROM budget_spend WHERE scope = ? AND window_start = ?",
                                   (scope.id, window.start)).fetchone()
                return 0 if row is None else int(row[0])

            spent = await self._db.transaction(work, write=False)
        self._hold(scope.id, window.start, spent)
        return spent

    async def spend(self, scope: Scope, window: Window, amount: int) -> None:
        spent = await self.spent(scope, window) + amount
        self._hold(scope.id, window.start, spent)
        if self._db is None:
            return
        self._spends += 1
        purge = self._spends % 1000 == 0
        now = self.clock()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO budget_spend VALUES (?, ?, ?, ?) ON CONFLICT (scope, window_start) DO UPDATE "
                         "SET spent = spent + excluded.spent",
                         (scope.id, window.start, window.end if math.isfinite(window.end) else 1e300, amount))
            if purge:
                conn.execute("DELETE FROM budget_spend WHERE window_end < ?", (now - SPENT_KEPT_S,))

        await self._db.transaction(work)

    def _hold(self, scope_id: str, start: float, spent: int) -> None:
        self._spent[(scope_id, start)] = spent
        self._spent.move_to_end((scope_id, start))
        while len(self._spent) > self.max_scopes:
            self._spent.popitem(last=False)

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()


_TAKE = """
-- KEYS: bucket ; ARGV: now (ms), rpm (0: none), tpm (0: none), tokens ; -> {taken, requests, tokens}
local now, rpm, tpm, asked = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local v = redis.call('HMGET', KEYS[1], 'r', 't', 'at')
local r, t, at = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or now
local elapsed = math.max(0, now - at)
if rpm > 0 then r = math.max(0, r - elapsed * rpm / 60000) else r = 0 end
if tpm > 0 then t = math.max(0, t - elapsed * tpm / 60000) else t = 0 end
local fits = (rpm == 0 or r + 1 <= rpm) and (tpm == 0 or t + asked <= tpm)
if not fits then return {0, tostring(r), tostring(t)} end
if rpm > 0 then r = r + 1 end
if tpm > 0 then t = t + asked end
redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(t), 'at', tostring(now))
local keep = 1000
if rpm > 0 then keep = math.max(keep, math.ceil(r * 60000 / rpm)) end
if tpm > 0 then keep = math.max(keep, math.ceil(t * 60000 / tpm)) end
redis.call('PEXPIRE', KEYS[1], keep)
return {1, tostring(r), tostring(t)}
"""

_ADJUST = """
-- KEYS: bucket ; ARGV: now (ms), rpm (0: none), tpm (0: none), requests added, tokens added ; -> {requests, tokens}
local now, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'r', 't', 'at')
local r, t, at = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or now
local elapsed = math.max(0, now - at)
if rpm > 0 then r = math.max(0, r - elapsed * rpm / 60000 + tonumber(ARGV[4])) else r = 0 end
if tpm > 0 then t = math.max(0, t - elapsed * tpm / 60000 + tonumber(ARGV[5])) else t = 0 end
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(t), 'at', tostring(now))
  local keep = 1000
  if rpm > 0 then keep = math.max(keep, math.ceil(r * 60000 / rpm)) end
  if tpm > 0 then keep = math.max(keep, math.ceil(t * 60000 / tpm)) end
  redis.call('PEXPIRE', KEYS[1], keep)
end
return {tostring(r), tostring(t)}
"""


class RedisLimitCounters:
    """Counters every replica shares through Redis (shared mode; see the module docstring)."""

    def __init__(self, client: RedisClient, *, prefix: str = "ragproxy:credits",
                 fallback: LocalLimitCounters | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self.fallback = fallback if fallback is not None else LocalLimitCounters()
        self.wipe: WipeWatch | None = None
        self._take = client.register_script(_TAKE)
        self._adjust = client.register_script(_ADJUST)
        self._last_warning = float("-inf")

    def _bucket(self, scope: Scope) -> str:
        return f"{self.prefix}:{{rl:{quote(scope.id, safe='')}}}"

    def _spent_key(self, scope: Scope, window: Window) -> str:
        return f"{self._bucket(scope)}:spent:{int(window.start)}"

    async def _shared(self, operation: Callable[[], Awaitable[T]], local: Callable[[], Awaitable[T]]) -> T:
        """``operation`` on Redis, or ``local`` on this replica's counters while Redis cannot be believed."""
        try:
            if self.wipe is not None:
                self.wipe.refuse()
            return await operation()
        except (RedisError, OSError, StoreUnavailable) as exc:
            now = time.monotonic()
            if now - self._last_warning >= 60.0:
                self._last_warning = now
                log.warning("rate limits and budgets counted on this replica alone: Redis unavailable (%s)", exc)
            return await local()

    @staticmethod
    def _limits(scope: Scope) -> list[int]:
        return [scope.limits.rpm_limit or 0, scope.limits.tpm_limit or 0]

    async def take(self, scope: Scope, tokens: int, now: float) -> tuple[bool, Level]:
        async def shared() -> tuple[bool, Level]:
            ok, requests, counted = await self._take(keys=[self._bucket(scope)],
                                                     args=[int(now * 1000), *self._limits(scope), tokens])
            return int(ok) == 1, Level(float(requests), float(counted))

        return await self._shared(shared, lambda: self.fallback.take(scope, tokens, now))

    async def adjust(self, scope: Scope, requests: float, tokens: float, now: float) -> None:
        async def shared() -> None:
            await self._adjust(keys=[self._bucket(scope)],
                               args=[int(now * 1000), *self._limits(scope), requests, tokens, 1])

        await self._shared(shared, lambda: self.fallback.adjust(scope, requests, tokens, now))

    async def level(self, scope: Scope, now: float) -> Level:
        async def shared() -> Level:
            requests, counted = await self._adjust(keys=[self._bucket(scope)],
                                                   args=[int(now * 1000), *self._limits(scope), 0, 0, 0])
            return Level(float(requests), float(counted))

        return await self._shared(shared, lambda: self.fallback.level(scope, now))

    async def spent(self, scope: Scope, window: Window) -> int:
        async def shared() -> int:
            found = await self.client.get(self._spent_key(scope, window))
            return int(found or 0)

        return await self._shared(shared, lambda: self.fallback.spent(scope, window))

    async def spend(self, scope: Scope, window: Window, amount: int) -> None:
        async def shared() -> None:
            key = self._spent_key(scope, window)
            await self.client.incrby(key, amount)
            if math.isfinite(window.end):
                await self.client.pexpireat(key, int((window.end + SPENT_KEPT_S) * 1000))

        await self._shared(shared, lambda: self.fallback.spend(scope, window, amount))

    async def close(self) -> None:
        await self.fallback.close()
