"""Proxy replicas in shared mode for the scale tests.

``shared_replica`` runs one replica in-thread (:class:`~tests.support.proxy_server.ProxyServer`, with its admin
app). When the runtime wires shared mode itself (``Runtime.shared``), the replica is used as built; until then the
helper applies :func:`proxy.cache_tiers.shared_mode.build_shared` exactly as the runtime is to do (``l1`` and
``versions`` replaced, the shared components started and stopped with the server).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from proxy.assembly.config import Settings
from proxy.assembly.runtime import Runtime
from tests.support.proxy_server import ProxyServer, proxy_settings
from tiers.near_cache import NearCachedStore


@contextmanager
def shared_replica(settings: Settings) -> Iterator[ProxyServer]:
    """One replica in shared mode (``redis.url`` set), with its admin app."""
    runtime = Runtime(settings)
    assert runtime.shared is not None, "shared_replica needs redis.url"
    with ProxyServer(settings, runtime, admin=True) as server:
        yield server


@contextmanager
def shared_replicas(count: int, llm_url: str, redis_url: str, **overrides: Any) -> Iterator[list[ProxyServer]]:
    """``count`` replicas on one Redis; ``overrides`` are dotted settings (``cache.expose_key=True``...)."""
    with ExitStack() as stack:
        servers = []
        for _ in range(count):
            settings = proxy_settings(llm_url, **{"redis.url": redis_url, "cache.l3.enabled": False, **overrides})
            servers.append(stack.enter_context(shared_replica(settings)))
        deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
        while not all(s.runtime.shared is not None and s.runtime.shared.bus.trusted for s in servers):
            assert time.monotonic() < deadline, "every replica's invalidation bus is live before the test starts"
            time.sleep(0.02)
        yield servers


def wait_stored(server: ProxyServer, key: str, timeout_s: float = 10.0) -> None:
    """Wait until ``key`` is in the shared Redis store seen by ``server``. A miss is stored after its answer
    was sent (so that storing never delays the client), so the next request of a fast client may arrive at
    another replica first."""
    store = server.l1.store
    assert isinstance(store, NearCachedStore)
    deadline = time.monotonic() + timeout_s
    while server.call(store.shared.read(key)) is None:
        assert time.monotonic() < deadline, f"{key} never reached the shared store"
        time.sleep(0.02)


def provision_user(url: str, credit: int, *, cluster: bool = False) -> str:
    """An API key for user ``ann`` of tenant ``acme`` with ``credit`` micro-credits, made straight in Redis."""
    from proxy.auth.redis_keys import RedisKeyStore
    from proxy.credits.redis_store import RedisCreditStore

    async def provision() -> str:
        keys = RedisKeyStore.from_url(url, cluster=cluster)
        store = RedisCreditStore.from_url(url, cluster=cluster)
        try:
            created = await keys.create("ann", "acme")
            await store.top_up("ann", credit, tenant="acme")
            return created.plaintext
        finally:
            await keys.close()
            await store.close()

    return asyncio.run(provision())
