"""Redis clients from URLs, in one place for every shared-mode component (caches, bus, credits, keys).

URLs:

* ``redis://[[user]:password@]host:port[/db]``, ``rediss://...``, ``unix://...`` — one server (redis-py's format).
* ``redis+cluster://host:port`` / ``rediss+cluster://...``, or ``cluster=True`` — a Redis Cluster (any node
  seeds it): ``redis.asyncio.RedisCluster``, which follows ``MOVED``/``ASK`` and failovers.
* ``redis+sentinel://[[user]:password@]host1:26379,host2:26379/<service>[/<db>]`` — the master that the
  Sentinels name for ``service`` (port 26379 when left out; the credentials are the master's, the Sentinels are
  reached without). ``Sentinel.master_for`` asks the Sentinels for the master on every new connection and drops
  connections to a demoted one, so clients follow failovers; pub/sub connections too.

:func:`connect` bounds every wait: a connection is waited for at most ``timeout_s`` when ``max_connections`` are
in use (a blocking pool, Sentinel included), connects and Sentinel queries time out after ``timeout_s``, replies
after ``read_timeout_s`` (``None``: never, for subscriptions). Closing a Sentinel client closes its Sentinel
connections too. :func:`check_url` validates a URL without connecting (configuration time).

A command that fails on a connection error (the pooled connection was closed by a Redis that restarted since it
was last used) is sent once more at once, on a new connection: without that, every connection pooled before a
restart failed its next command, for minutes after Redis was back. Timeouts are never retried (a stalled Redis
must not double every wait); riding out the restart itself is the caller's choice
(:func:`proxy.stores.redis_client.reconnecting`). Redis Cluster clients follow their own retry rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

KEY_PREFIX = "ragproxy"
"""The prefix of every key and channel the shared components keep in Redis, unless configured (``redis.prefix``)."""

RedisClient = aioredis.Redis | RedisCluster

SENTINEL_PORT = 26379
_PLAIN = ("redis", "rediss", "unix")
_CLUSTER = ("redis+cluster", "rediss+cluster")
_SENTINEL = ("redis+sentinel",)
_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def is_sentinel(url: str) -> bool:
    return _scheme(url) in _SENTINEL


def is_cluster(url: str, cluster: bool = False) -> bool:
    """Cluster mode: forced by ``cluster`` or named by the ``+cluster`` scheme."""
    return cluster or _scheme(url) in _CLUSTER


def _host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host or (port_text and not port_text.isdigit()):
        raise ValueError(f"{text!r} is not host[:port]")
    port = int(port_text) if port_text else SENTINEL_PORT
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range")
    return host, port


def parse_sentinel_url(url: str) -> SentinelAddress:
    """``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]``; ValueError if malformed."""
    if not is_sentinel(url):
        raise ValueError("a Sentinel URL starts with redis+sentinel://")
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError("a Sentinel URL takes no ?options or #fragment")
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    if not hosts:
        raise ValueError("a Sentinel URL names at least one Sentinel host[:port]")
    sentinels = tuple(_host_port(host) for host in hosts.split(","))
    path = [unquote(segment) for segment in parts.path.strip("/").split("/")] if parts.path.strip("/") else []
    if not path or len(path) > 2 or not path[0]:
        raise ValueError("a Sentinel URL ends with /<service name>[/<db>], e.g. /mymaster/0")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"database {path[1]!r} is not a number")
    return SentinelAddress(sentinels, path[0], int(path[1]) if len(path) == 2 else 0,
                           unquote(username) or None, unquote(password) or None)


def check_url(url: str) -> str:
    """``url`` if it is a Redis URL :func:`connect` understands, else ValueError saying what is allowed."""
    scheme = _scheme(url)
    if scheme in _SENTINEL:
        parse_sentinel_url(url)
    elif scheme not in _PLAIN + _CLUSTER:
        raise ValueError("must be a redis://, rediss://, unix://, redis+cluster://, rediss+cluster:// or "
                         "redis+sentinel://host:26379[,host:26379...]/<service>[/<db>] URL")
    return url


def _once_more() -> Retry:
    """A command that failed on a connection error is sent once more at once (see the module docstring)."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A Sentinel-managed pool that waits (up to ``timeout``) for a free connection rather than failing."""


class _SentinelMaster(aioredis.Redis):
    """A master client that also closes its Sentinel connections when closed."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool = self.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


def sentinel_master(url: str, *, timeout_s: float, read_timeout_s: float | None,
                    max_connections: int = 64) -> aioredis.Redis:
    """A client to the master the Sentinels of ``url`` (``redis+sentinel://``) name, following failovers."""
    address = parse_sentinel_url(url)
    sentinel = Sentinel(list(address.sentinels),  # type: ignore[no-untyped-call]
                        sentinel_kwargs={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s})
    client: aioredis.Redis = sentinel.master_for(
        address.service, redis_class=_SentinelMaster, connection_pool_class=_BlockingSentinelPool,
        db=address.db, username=address.username, password=address.password, max_connections=max_connections,
        timeout=timeout_s, socket_timeout=read_timeout_s, socket_connect_timeout=timeout_s, retry=_once_more())
    return client


def connect(url: str, *, cluster: bool = False, timeout_s: float = 2.0, read_timeout_s: float | None = _UNSET,
            max_connections: int = 64) -> RedisClient:
    """A client for ``url`` (see the module's docstring); ``read_timeout_s`` defaults to ``timeout_s``."""
    read_timeout: float | None = timeout_s if read_timeout_s is _UNSET else read_timeout_s
    check_url(url)
    if is_sentinel(url):
        return sentinel_master(url, timeout_s=timeout_s, read_timeout_s=read_timeout, max_connections=max_connections)
    plain = url.replace("+cluster://", "://")
    if is_cluster(url, cluster):
        return RedisCluster.from_url(plain, max_connections=max_connections, socket_timeout=read_timeout,
                                     socket_connect_timeout=timeout_s)
    pool = aioredis.BlockingConnectionPool.from_url(
        plain, max_connections=max_connections, timeout=timeout_s, socket_timeout=read_timeout,
        socket_connect_timeout=timeout_s, retry=_once_more())
    return aioredis.Redis(connection_pool=pool)
