"""The shared credit store: Redis (standalone, Sentinel or Cluster), one Lua script per operation.

Key layout (``U`` = the user id percent-encoded, so ``{``, ``}``, ``:`` and spaces in ids cannot break a hash
tag; every per-user key carries the tag ``{U}`` and lives in one Cluster slot, so each script is atomic across
replicas):

* ``<prefix>:{U}:account`` — hash ``available``, ``held``, ``tenant``
* ``<prefix>:{U}:holds`` — zset request id → deadline (epoch ms); ``<prefix>:{U}:hold-amounts`` — hash id →
  amount
* ``<prefix>:{U}:closed:<request id>`` — ``outcome:charged`` with the retention TTL (idempotent
  settle/release)
* ``<prefix>:{U}:ledger`` — stream, append-only, never trimmed; one entry per top-up and per charge
* ``<prefix>:users`` — zset of raw user ids (score 0, walked in byte order for ledger listings)
* ``<prefix>:deadlines`` — zset ``"U request-id"`` → deadline: the index the reaper walks to find the holds of
  dead proxies. It is written *before* the hold exists and removed only *after* the hold is gone (settled,
  released or reaped; a removal lost in a crash leaves an entry whose reaping is a no-op), so no hold is ever
  missed. It spans users, so it is a separate (non-atomic) call, safe in that order.

Clocks: deadlines come from the caller's clock; replicas need clocks in sync to well within the reservation
TTL.

Restarts: every command is sent once more on a new connection when its pooled one turns out closed
(:mod:`tiers.redis_connect`); the operations a request waits on (reserve, settle, release, balance; and API-key
lookups, idempotency claims) are also retried while Redis refuses connections or loads its data, for up to
``reconnect_s`` (:func:`reconnecting`): a restart of a persistent Redis is a pause, not an error. Each of them is
safe to run twice (by request id, by claim owner, or read-only), and so is a top-up (by its entry id): a command
Redis ran just before the connection broke may be sent again.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote, unquote

import redis.asyncio as aioredis

from proxy.core.redis_settings import RedisSettings
from proxy.credits import redis_scripts
from proxy.credits.store import (
    ANY_ENTRY,
    Account,
    ChargeDetails,
    InsufficientCredit,
    LedgerEntry,
    LedgerFilter,
    LedgerPage,
    RequestClosed,
    Reservation,
    Settlement,
    decode_cursor,
    encode_cursor,
)
from proxy.stores.redis_client import (
    CONNECTION_FAILURES,
    RedisClient,
    as_text,
    connect,
    reconnecting,
    unavailable_on_failure,
)
from proxy.stores.redis_wipe import WipeWatch

_REDIS = RedisSettings()  # the defaults, defined once there


class RedisCreditStore:
    """Credit store shared by every proxy replica through Redis."""

    name = "redis"

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "ragproxy:credits",
        finished_retention_s: float = 7 * 86400,
        reap_batch: int = 500,
        clock: Callable[[], float] = time.time,
        reconnect_s: float = _REDIS.reconnect_s,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.finished_retention_s = finished_retention_s
        self.reap_batch = reap_batch
        self.clock = clock
        self.reconnect_s = reconnect_s
        self.wipe: WipeWatch | None = None
        self._reserve = client.register_script(redis_scripts.RESERVE)
        self._settle = client.register_script(redis_scripts.SETTLE)
        self._release = client.register_script(redis_scripts.RELEASE)
        self._reap = client.register_script(redis_scripts.REAP)
        self._top_up = client.register_script(redis_scripts.TOP_UP)

    @classmethod
    def from_url(
        cls, url: str, *, cluster: bool = False, timeout_s: float = 2.0, max_connections: int = 64, **options: Any
    ) -> RedisCreditStore:
        """A store on its own client for ``url`` (see :func:`~proxy.stores.redis_client.connect`)."""
        return cls(connect(url, cluster=cluster, timeout_s=timeout_s, max_connections=max_connections), **options)

    async def close(self) -> None:
        await self.client.aclose()
        if isinstance(self.client, aioredis.Redis):
            await self.client.connection_pool.disconnect()

    def _key(self, user: str, part: str) -> str:
        return f"{self.prefix}:{{{quote(user, safe='')}}}:{part}"

    def _hold_keys(self, user: str, request_id: str) -> list[str]:
        return [
            self._key(user, "account"),
            self._key(user, "holds"),
            self._key(user, "hold-amounts"),
            self._key(user, f"closed:{request_id}"),
        ]

    def _deadline_member(self, user: str, request_id: str) -> str:
        return f"{quote(user, safe='')} {request_id}"

    async def top_up(self, user: str, amount: int, *, tenant: str = "default", note: str = "") -> int:
        if amount <= 0:
            raise ValueError("a top-up must be positive")
        entry = f"topup-{uuid.uuid4().hex}"
        if self.wipe is not None:
            self.wipe.refuse()
        async with unavailable_on_failure("top-up"):
            await self.client.zadd(f"{self.prefix}:users", {user: 0})
            result = await self._top_up(
                keys=[self._key(user, "account"), self._key(user, "ledger"), self._key(user, f"closed:{entry}")],
                args=[amount, tenant, int(self.clock() * 1000), entry, note, int(self.finished_retention_s)],
            )
            if self.wipe is not None:
                await self.wipe.confirm()  # credited in a Redis that lost its data: the restore would not have it
        return int(result)

    @reconnecting
    async def balance(self, user: str) -> Account:
        async with unavailable_on_failure("balance"):
            raw = await self.client.hgetall(self._key(user, "account"))
        values = {as_text(k): as_text(v) for k, v in raw.items()}
        return Account(user, values.get("tenant", ""), int(values.get("available", 0)), int(values.get("held", 0)))

    @reconnecting
    async def reserve(
        self, request_id: str, user: str, amount: int, ttl: float, *, now: float | None = None
    ) -> Reservation | InsufficientCredit:
        if amount < 0:
            raise ValueError("a reservation cannot be negative")
        deadline_ms = int(((self.clock() if now is None else now) + ttl) * 1000)
        member = self._deadline_member(user, request_id)
        async with unavailable_on_failure("reserve"):
            await self.client.zadd(f"{self.prefix}:deadlines", {member: deadline_ms})
            ok, held, available, deadline = await self._reserve(
                keys=self._hold_keys(user, request_id), args=[request_id, amount, deadline_ms]
            )
            if int(ok) != 1:
                await self.client.zrem(f"{self.prefix}:deadlines", member)
        if int(ok) == -1:
            raise RequestClosed(request_id)
        if int(ok) == 0:
            return InsufficientCredit(user, int(available), amount)
        return Reservation(request_id, user, int(held), int(deadline) / 1000, int(available))

    @reconnecting
    async def settle(
        self, request_id: str, user: str, actual: int, details: ChargeDetails, *, now: float | None = None
    ) -> Settlement:
        if actual < 0:
            raise ValueError("a charge cannot be negative")
        at_ms = int((self.clock() if now is None else now) * 1000)
        async with unavailable_on_failure("settle"):
            outcome, charged, available, shortfall = await self._settle(
                keys=[*self._hold_keys(user, request_id), self._key(user, "ledger")],
                args=[
                    request_id,
                    actual,
                    at_ms,
                    int(self.finished_retention_s),
                    details.tenant,
                    details.model,
                    details.tier,
                    details.prompt_tokens,
                    details.completion_tokens,
                    details.cached_tokens,
                    details.usage_source,
                ],
            )
        await self._forget_deadline(user, request_id)
        return Settlement(request_id, as_text(outcome), int(charged), int(available), int(shortfall))

    @reconnecting
    async def release(self, request_id: str, user: str) -> bool:
        async with unavailable_on_failure("release"):
            released = await self._release(
                keys=self._hold_keys(user, request_id), args=[request_id, int(self.finished_retention_s)]
            )
        await self._forget_deadline(user, request_id)
        return int(released) == 1

    async def _forget_deadline(self, user: str, request_id: str) -> None:
        """Drop the reaper's index entry; best effort (a leftover entry is reaped as a no-op)."""
        with contextlib.suppress(*CONNECTION_FAILURES):
            await self.client.zrem(f"{self.prefix}:deadlines", self._deadline_member(user, request_id))

    async def reap_expired(self, now: float | None = None) -> int:
        now_ms = int((self.clock() if now is None else now) * 1000)
        index = f"{self.prefix}:deadlines"
        released = 0
        async with unavailable_on_failure("reap"):
            while True:
                due = await self.client.zrangebyscore(index, "-inf", f"({now_ms}", start=0, num=self.reap_batch)
                if not due:
                    return released
                users = {unquote(as_text(member).split(" ", 1)[0]) for member in due}
                for user in users:
                    released += int(
                        await self._reap(
                            keys=self._hold_keys(user, "")[:3],
                            args=[now_ms, 1_000_000],
                        )
                    )
                await self.client.zrem(index, *due)

    async def ledger(self, where: LedgerFilter = ANY_ENTRY, cursor: str | None = None, limit: int = 100) -> LedgerPage:
        after_user, after_id = (None, None) if cursor is None else decode_cursor(cursor)
        entries: list[LedgerEntry] = []
        if self.wipe is not None:
            self.wipe.refuse()  # an empty ledger is not the truth either
        async with unavailable_on_failure("ledger"):
            async for user in self._users_from(where.user, after_user):
                start = f"({after_id}" if user == after_user and after_id else "-"
                while True:
                    batch = await self.client.xrange(self._key(user, "ledger"), start, "+", count=limit) or []
                    for stream_id, fields in batch:
                        entry = _entry(user, {as_text(k): as_text(v) for k, v in (fields or {}).items()})
                        if where.matches(entry):
                            entries.append(entry)
                            if len(entries) == limit:
                                return LedgerPage(entries, encode_cursor(user, as_text(stream_id)))
                    if len(batch) < limit:
                        break
                    start = f"({as_text(batch[-1][0])}"
        return LedgerPage(entries, None)

    async def _users_from(self, only: str | None, after: str | None) -> AsyncIterator[str]:
        if only is not None:
            if after is None or only >= after:
                yield only
            return
        key = f"{self.prefix}:users"
        low = "-" if after is None else f"[{after}"
        while True:
            users = [as_text(u) for u in await self.client.zrangebylex(key, low, "+", start=0, num=100)]
            for user in users:
                yield user
            if len(users) < 100:
                return
            low = f"({users[-1]}"


def _entry(user: str, fields: dict[str, str]) -> LedgerEntry:
    return LedgerEntry(
        request_id=fields.get("request_id", ""),
        user=user,
        tenant=fields.get("tenant", ""),
        kind=fields.get("kind", ""),
        amount=int(fields.get("amount", 0)),
        balance_after=int(fields.get("balance_after", 0)),
        time=int(fields.get("time", 0)) / 1000,
        model=fields.get("model", ""),
        tier=fields.get("tier", ""),
        prompt_tokens=int(fields.get("prompt_tokens", 0)),
        completion_tokens=int(fields.get("completion_tokens", 0)),
        cached_tokens=int(fields.get("cached_tokens", 0)),
        usage_source=fields.get("usage_source", ""),
        shortfall=int(fields.get("shortfall", 0)),
        note=fields.get("note", ""),
    )
