"""Proxy replicas in shared mode for the scale tests.

``shared_replica`` runs one replica in-thread (:class:`~tests.support.proxy_server.ProxyServer`, with its admin
app). When the runtime wires shared mode itself (``Runtime.shared``), the replica is used as built; until then the
helper applies :func:`proxy.shared.build_shared` exactly as the runtime is to do (``l1`` and ``versions``
replaced, the shared components started and stopped with the server).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from proxy.config import Settings
from proxy.runtime import Runtime
from tests.support.proxy_server import ProxyServer, proxy_settings


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
        yield servers
