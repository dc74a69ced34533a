"""A Redis that came back empty while the proxy runs: noticed, and treated as an outage rather than believed.

A Redis restarted without persistence (or flushed, or failed over to an empty replica) answers every command, but
every balance, API key and idempotency key is gone: believed, it answers 429 ("no credits") and then 401 ("unknown
key") to everyone, and the settlements journaled meanwhile replay as ``no_account``. The start-up check
(:mod:`proxy.credits.persistence`) cannot see a Redis whose settings change, or which is replaced, later.

So the first replica to start writes a sentinel, ``<prefix>:sentinel``, holding a random token (``SET NX``: the
replicas after it read the same one), and every replica reads it back every ``redis.wipe_check_s``. A sentinel
that is gone or holds another token means the data went with it: the watch logs an error, ``/readyz`` answers 503
(``checks.redis``), and every credit, key, idempotency and response-owner operation raises
:class:`~proxy.stores.unavailable.StoreUnavailable` — the outage mode that already exists: reservations on the
outage allowance, settlements into the local journal, keys verified lately still trusted (revoked ones not),
the rest 503. A Redis that cannot be reached is not judged (that outage is handled where it occurs). The watch
clears when the sentinel is back with its token (the data restored from a backup); to go on with the empty Redis
instead, restart the replicas (the first writes a new sentinel). With Redis Cluster the sentinel lives on one
master: an empty restart of another goes unseen.

Between two checks a wipe is not known yet, so what must not be lost or misread in that window reads the sentinel
again itself (:meth:`WipeWatch.confirm`): an admin write of a key or of limits once written (a 503 rather than a 201
for a key the restore will not have), a revocation or a lookup that found nothing (a 503 rather than a 404 or a 401
for a key the empty Redis does not hold), and the owner of a stored response once recorded (kept in memory and
recorded again once the data is back, :mod:`proxy.stored.stages`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from redis.exceptions import RedisError

from proxy.core.redis_settings import RedisSettings
from proxy.stores.unavailable import StoreUnavailable
from tiers.background import stop_task

_REDIS = RedisSettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.credits")


class WipeWatch:
    """Notices a Redis that lost its data (see the module docstring)."""

    def __init__(self, client: Any, *, key: str = "ragproxy:sentinel", interval_s: float = _REDIS.wipe_check_s) -> None:
        """``client``: a redis-py asyncio client (standalone or Cluster)."""
        self.client = client
        self.key = key
        self.interval_s = interval_s
        self.token: bytes | None = None
        self.wiped = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Write (or read) the sentinel, then check it every ``interval_s``."""
        await self.check()
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="redis-wipe-watch")

    async def check(self) -> bool:
        """Read the sentinel once (write it first if this replica has none yet: Redis was down at start); whether
        Redis lost its data (unchanged when Redis does not answer)."""
        try:
            if self.token is None:
                await self.client.set(self.key, secrets.token_hex(16), nx=True)
                self.token = await self.client.get(self.key)
            found = await self.client.get(self.key)
        except (RedisError, OSError) as exc:
            log.debug("wipe check: Redis did not answer: %s", exc)
            return self.wiped
        wiped = bool(found != self.token)
        if wiped and not self.wiped:
            log.error("Redis lost its data while the proxy ran (the sentinel %s is %s): every balance, API key and "
                      "idempotency key it held is gone. Credits run on the outage allowance and the journal, and "
                      "/readyz answers 503, until the data is restored; to go on with the empty Redis, restart the "
                      "replicas", self.key, "gone" if found is None else "another")
        elif self.wiped and not wiped:
            log.warning("Redis has its data back (the sentinel %s is as it was): credits run on it again", self.key)
        self.wiped = wiped
        return wiped

    def refuse(self) -> None:
        """Raise :class:`StoreUnavailable` while Redis is known to have lost its data."""
        if self.wiped:
            raise StoreUnavailable("credit store (Redis) lost its data while the proxy ran; not believed")

    async def confirm(self) -> None:
        """Read the sentinel now, and :meth:`refuse` if it is gone: for a write that must be kept (an admin write, a
        stored response's owner; checked after it, so a wipe between two checks of the watch cannot take it unseen)
        and for an answer an empty Redis would give (an unknown key, a key that cannot be revoked)."""
        await self.check()
        self.refuse()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
