"""Redis clients as the stores use them: bounded connections (:func:`connect`), connection-level failures as
:class:`~proxy.stores.unavailable.StoreUnavailable` (:func:`unavailable_on_failure`), and operations retried while a
restarting Redis refuses connections or loads its data, for up to a store's ``reconnect_s`` (:func:`reconnecting`):
a restart of a persistent Redis is a pause, not an error. Only operations that are safe to run twice are retried."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    InvalidResponse,
    MasterDownError,
    RedisClusterException,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.stores.redis_wipe import WipeWatch
from proxy.stores.unavailable import StoreUnavailable
from tiers import redis_connect

RedisClient = aioredis.Redis | RedisCluster
# ClusterDownError / MasterDownError: a Cluster mid-failover (no master for a slot yet) is unavailable too.
# InvalidResponse: something that is not Redis answers on its port (a stopped Redis's port taken by another server).
CONNECTION_FAILURES = (RedisConnectionError, RedisTimeoutError, RedisClusterException, TryAgainError, ClusterDownError,
                MasterDownError, InvalidResponse, OSError)


def as_text(value: Any) -> str:
    """A Redis reply (bytes or not) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


@asynccontextmanager
async def unavailable_on_failure(what: str) -> AsyncIterator[None]:
    """Turn connection-level Redis failures into :class:`StoreUnavailable`."""
    try:
        yield
    except CONNECTION_FAILURES as exc:
        raise StoreUnavailable(f"credit store (Redis) {what}: {exc}") from exc


class Reconnects(Protocol):
    reconnect_s: float
    """How long an operation is retried while Redis refuses connections (0: not at all)."""
    wipe: WipeWatch | None
    """Set: operations are refused while it knows Redis lost its data."""


S = TypeVar("S", bound=Reconnects)
P = ParamSpec("P")
R = TypeVar("R")


def reconnecting(operation: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
                 ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Run ``operation`` again while it fails because Redis refuses or drops connections (restarting, or loading
    its data after a restart), pausing 50 ms, doubling, at most 0.5 s, for up to the store's ``reconnect_s``. Only
    for operations that are safe to run twice; timeouts are never retried. A Redis that lost its data (the store's
    :class:`~proxy.stores.redis_wipe.WipeWatch`) is unavailable: the operation is not run."""

    @functools.wraps(operation)
    async def retried(store: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if store.wipe is not None:
            store.wipe.refuse()
        deadline = time.monotonic() + store.reconnect_s
        pause = 0.05
        while True:
            try:
                return await operation(store, *args, **kwargs)
            except StoreUnavailable as exc:
                if not isinstance(exc.__cause__, RedisConnectionError) or time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    return retried


def connect(url: str, *, cluster: bool = False, timeout_s: float = 2.0, max_connections: int = 64) -> RedisClient:
    """A client for ``url`` (standalone, ``+cluster`` or ``redis+sentinel``; see :mod:`tiers.redis_connect`) with
    bounded waits: ``max_connections`` at most, each waited for ``timeout_s``."""
    return redis_connect.connect(url, cluster=cluster, timeout_s=timeout_s, max_connections=max_connections)


