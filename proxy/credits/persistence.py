"""Whether the Redis that holds the credit ledger keeps it across a restart, checked once when the proxy starts.

A Redis without persistence (``appendonly no`` and no ``save`` points) comes back from a restart empty: every
balance, hold, ledger entry, API key and idempotency key is gone, and the settlements journaled during the outage
then replay as ``no_account`` — never charged. What the check finds (:func:`persistence`, from ``CONFIG GET``):

* ``durable`` — the append-only file is on: a restart loses at most what its ``appendfsync`` policy allows
  (``everysec``: about a second of writes; ``always``: nothing acknowledged). Nothing is said.
* ``snapshots`` — only RDB ``save`` points: a restart loses every change since the last snapshot. A warning.
* ``none`` — neither: ``serve`` refuses to start (:class:`VolatileCreditStore`, exit code 2) unless
  ``credits.allow_volatile_redis`` is set, and then logs an error at every start.
* ``unknown`` — ``CONFIG`` is not allowed (some managed services rename or forbid it) or Redis did not answer:
  a warning to make sure it persists.

With Redis Cluster every master is asked; the weakest answer counts.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from proxy.stores.redis_client import RedisClient

log = logging.getLogger("ragproxy.credits")


class Persistence(Enum):
    """What a Redis keeps across a restart, weakest last."""

    DURABLE = "durable"
    SNAPSHOTS = "snapshots"
    UNKNOWN = "unknown"
    NONE = "none"


class VolatileCreditStore(Exception):
    """Credits would live in a Redis that keeps nothing across a restart."""


def persistence(appendonly: str | None, save: str | None) -> Persistence:
    """What a Redis keeps, from its ``appendonly`` and ``save`` settings (``None``: not known)."""
    if appendonly is None:
        return Persistence.UNKNOWN
    if appendonly.strip().lower() == "yes":
        return Persistence.DURABLE
    if save is None:
        return Persistence.UNKNOWN
    return Persistence.SNAPSHOTS if save.strip() else Persistence.NONE


def _setting(answer: Any, name: str) -> str | None:
    """One value of a ``CONFIG GET`` answer (a dict, or a flat list of names and values)."""
    if isinstance(answer, list):
        answer = dict(zip(answer[::2], answer[1::2], strict=False))
    if not isinstance(answer, dict):
        return None
    for key, value in answer.items():
        if (key.decode() if isinstance(key, bytes) else str(key)) == name:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


async def redis_persistence(client: RedisClient) -> Persistence:
    """What ``client``'s Redis keeps (every master of a Cluster: the weakest)."""
    nodes: list[Any] = client.get_primaries() if isinstance(client, RedisCluster) else [None]
    found: list[Persistence] = []
    for node in nodes:
        where = {"target_nodes": node} if node is not None else {}
        try:
            appendonly = _setting(await client.execute_command("CONFIG", "GET", "appendonly", **where), "appendonly")
            save = _setting(await client.execute_command("CONFIG", "GET", "save", **where), "save")
        except (RedisError, OSError) as exc:
            log.debug("CONFIG GET failed: %s", exc)
            appendonly = save = None
        found.append(persistence(appendonly, save))
    order = list(Persistence)
    return max(found, key=order.index)


async def check_persistence(client: RedisClient, *, allow_volatile: bool) -> Persistence:
    """Refuse (or warn about) credits in a Redis that would lose them in a restart (see the module docstring)."""
    found = await redis_persistence(client)
    if found is Persistence.NONE:
        message = ("credits are kept in a Redis without persistence (appendonly no, no save points): a restart "
                   "erases every balance, API key and idempotency key, and settlements journaled meanwhile are "
                   "never charged. Set appendonly yes (appendfsync everysec or always) on that Redis")
        if not allow_volatile:
            raise VolatileCreditStore(f"{message}, or credits.allow_volatile_redis=true to start anyway")
        log.error("%s (starting anyway: credits.allow_volatile_redis is set)", message)
    elif found is Persistence.SNAPSHOTS:
        log.warning("credits are kept in a Redis that only takes snapshots (save points, appendonly no): a restart "
                    "loses every balance change since the last snapshot. Set appendonly yes")
    elif found is Persistence.UNKNOWN:
        log.warning("could not tell whether the Redis holding credits persists them (CONFIG GET failed): make sure "
                    "it has appendonly yes, or a restart may erase every balance")
    return found
