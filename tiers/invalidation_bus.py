"""Invalidation bus: Redis pub/sub between proxy replicas, with acknowledgements and a self-fencing lease.

Why: every replica keeps a near cache (in-process copies of shared entries) and a local copy of the knowledge
versions. When one replica deletes entries or bumps a version, every other replica must drop its copies before
the admin call returns. Redis pub/sub carries the messages; no protocol between replicas other than Redis.

Channel: ``<prefix>:{bus}:events``. Standalone Redis: ``PUBLISH``/``SUBSCRIBE``. Redis Cluster: sharded pub/sub
(``SPUBLISH``/``SSUBSCRIBE``) on the master that owns the channel's slot — every replica subscribes on that one
node, so the ``SPUBLISH`` reply counts every subscriber (a plain cluster ``PUBLISH`` counts only the clients of
the node it was sent to). After a failover the owner is looked up again from the cluster's topology.

Messages (JSON): ``{"t": kind, "id": ..., "from": replica, ...}``; kinds ``keys`` (``keys``: list), ``clear``,
``ver`` (``tenant``, ``namespace``, ``version``), ``hb`` (heartbeat) and ``ack`` (``id`` of the acknowledged
message, ``to``: its sender). A replica applies a message through the handlers registered for its kind and then
publishes an ``ack``.

The guarantee (see docs/scale-out.md): :meth:`InvalidationBus.broadcast` returns when every receiver counted by
``PUBLISH`` acknowledged — or, when some did not within ``ack_timeout_s``, only after ``lease_s`` has passed
since the publish. A replica trusts its local copies only until ``lease_s`` after the *send* time of the last
of its own heartbeats (every ``heartbeat_s``) that it has received and processed (:attr:`trusted`). Messages on
the channel arrive in publish order and are applied one by one, so a replica that has not applied a message
has processed only heartbeats sent before that message was published: its trust ends before the sender's
``lease_s`` wait does. On every (re)subscription, and after a silent gap longer than the
lease, the ``resync`` callbacks run (drop the near cache, reload versions) before the replica trusts its copies
again. Remaining gap: a replica whose connection Redis has already dropped but which has not noticed yet is not
counted by ``PUBLISH``; it stops serving copies at most ``lease_s`` after its last message.

Deciding (:class:`Pending`, :func:`lease_valid`) is pure; :class:`InvalidationBus` is the async driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

log = logging.getLogger("ragproxy.bus")

Message = dict[str, Any]
Handler = Callable[[Message], Awaitable[None]]
Resync = Callable[[], Awaitable[None]]


class BusUnavailable(Exception):
    """The invalidation could not be published (Redis unreachable): the admin call must fail loudly."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one broadcast went: ``expected`` receivers (the ``PUBLISH`` reply), ``acked`` of them in time."""

    message_id: str
    expected: int
    acked: int
    complete: bool
    waited_s: float
    fenced: bool  # some receiver did not acknowledge: the call waited out the lease


@dataclass(slots=True)
class Pending:
    """Acknowledgements of one message: complete once ``expected`` is known and reached."""

    acked: set[str] = field(default_factory=set)
    expected: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def ack(self, replica: str) -> None:
        self.acked.add(replica)
        self._check()

    def expect(self, count: int) -> None:
        self.expected = count
        self._check()

    def _check(self) -> None:
        if self.expected is not None and len(self.acked) >= self.expected:
            self.done.set()


def lease_valid(connected: bool, last_seen: float, now: float, lease_s: float) -> bool:
    """A replica may serve its local copies only while the bus delivered something within the lease."""
    return connected and now - last_seen < lease_s


class _Endpoint:
    """Where to publish and subscribe: the standalone server, or the cluster master owning the channel."""

    def __init__(self, url: str, channel: str, *, cluster: bool, timeout_s: float) -> None:
        self.url = url.replace("+cluster://", "://")
        self.channel = channel
        self.cluster = cluster or "+cluster://" in url
        self.timeout_s = timeout_s
        self._cluster_client: RedisCluster | None = None
        self._publisher: aioredis.Redis | None = None

    async def node_client(self, *, reads_bounded: bool) -> aioredis.Redis:
        """A fresh client to the node the channel lives on (``reads_bounded``: replies time out, not for
        a subscription that waits for messages)."""
        read_timeout = self.timeout_s if reads_bounded else None
        if not self.cluster:
            return aioredis.Redis.from_url(self.url, socket_connect_timeout=self.timeout_s,
                                           socket_timeout=read_timeout)
        if self._cluster_client is None:
            self._cluster_client = RedisCluster.from_url(self.url, socket_timeout=self.timeout_s,
                                                         socket_connect_timeout=self.timeout_s)
            await self._cluster_client.initialize()
        else:
            await self._cluster_client.nodes_manager.initialize()  # topology may have changed (failover)
        node = self._cluster_client.get_node_from_key(self.channel)
        if node is None:
            raise ConnectionError(f"no cluster node serves {self.channel}")
        return aioredis.Redis(host=node.host, port=int(node.port), socket_connect_timeout=self.timeout_s,
                              socket_timeout=read_timeout)

    async def publish(self, payload: bytes) -> int:
        """Publish once, re-resolving the node after a failure; the number of receivers."""
        for attempt in (1, 2):
            try:
                if self._publisher is None:
                    self._publisher = await self.node_client(reads_bounded=True)
                if self.cluster:
                    return int(await self._publisher.spublish(self.channel, payload))
                return int(await self._publisher.publish(self.channel, payload))
            except Exception:
                await self._drop_publisher()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def subscribe(self, client: aioredis.Redis) -> aioredis.client.PubSub:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        if self.cluster:
            await pubsub.ssubscribe(self.channel)
        else:
            await pubsub.subscribe(self.channel)
        return pubsub

    async def _drop_publisher(self) -> None:
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                await self._publisher.aclose()
            self._publisher = None

    async def close(self) -> None:
        await self._drop_publisher()
        if self._cluster_client is not None:
            with contextlib.suppress(Exception):
                await self._cluster_client.aclose()
            self._cluster_client = None


class InvalidationBus:
    """One replica's end of the bus: publishes, receives, applies, acknowledges."""

    def __init__(self, url: str, *, cluster: bool = False, prefix: str = "ragproxy", replica_id: str | None = None,
                 heartbeat_s: float = 0.5, lease_s: float = 3.0, ack_timeout_s: float = 1.0,
                 timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 on_event: Callable[[str], None] | None = None) -> None:
        """``heartbeat_s``: period of this replica's own heartbeat; ``lease_s``: silence after which local
        copies are no longer served (> several heartbeats); ``ack_timeout_s``: how long a broadcast waits for
        acknowledgements before it waits out the lease instead; ``on_event``: told ``sent``, ``received``,
        ``acked``, ``incomplete``, ``resync``, ``lost`` (metrics)."""
        if lease_s <= heartbeat_s:
            raise ValueError("lease_s must be longer than heartbeat_s")
        self.channel = f"{prefix}:{{bus}}:events"
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self.ack_timeout_s = ack_timeout_s
        self._endpoint = _Endpoint(url, self.channel, cluster=cluster, timeout_s=timeout_s)
        self._clock = clock
        self._on_event = on_event or (lambda _event: None)
        self._handlers: dict[str, list[Handler]] = {}
        self._resyncs: list[Resync] = []
        self._pending: dict[str, Pending] = {}
        self._connected = False
        self._last_seen = float("-inf")
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed = asyncio.Event()
        self.generation = 0  # bumped by every applied invalidation and every resync (near-cache fill guard)

    # -- wiring ----------------------------------------------------------------------------------------------

    def on(self, kind: str, handler: Handler) -> None:
        """Apply messages of ``kind`` with ``handler`` (before this replica acknowledges them)."""
        self._handlers.setdefault(kind, []).append(handler)

    def on_resync(self, resync: Resync) -> None:
        """Run after every (re)subscription and after a silent gap, before local copies are trusted."""
        self._resyncs.append(resync)

    @property
    def trusted(self) -> bool:
        return lease_valid(self._connected, self._last_seen, self._clock(), self.lease_s)

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, wait_s: float = 5.0) -> bool:
        """Start listening and heartbeating; ``True`` once subscribed (``False`` after ``wait_s``: the bus keeps
        retrying in the background and local copies stay untrusted meanwhile)."""
        self._tasks = [asyncio.create_task(self._listen(), name="bus-listen"),
                       asyncio.create_task(self._heartbeat(), name="bus-heartbeat")]
        try:
            await asyncio.wait_for(self._subscribed.wait(), wait_s)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self._connected = False
        await self._endpoint.close()

    # -- sending ---------------------------------------------------------------------------------------------

    async def broadcast(self, kind: str, **fields: Any) -> Delivery:
        """Publish one message and wait until every receiver applied it (or the lease ran out); see module doc."""
        message_id = uuid.uuid4().hex
        pending = self._pending[message_id] = Pending()
        started = self._clock()
        payload = orjson.dumps({"t": kind, "id": message_id, "from": self.replica_id, **fields})
        try:
            try:
                receivers = await self._endpoint.publish(payload)
            except Exception as exc:
                raise BusUnavailable(f"invalidation bus: publish failed ({exc.__class__.__name__}: {exc})") from exc
            self._on_event("sent")
            pending.expect(receivers)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pending.done.wait(), self.ack_timeout_s)
            fenced = not pending.done.is_set()
            if fenced:
                self._on_event("incomplete")
                remaining = self.lease_s - (self._clock() - started)
                if remaining > 0:
                    await asyncio.sleep(remaining)
            return Delivery(message_id, receivers, min(len(pending.acked), receivers), not fenced,
                            self._clock() - started, fenced)
        finally:
            self._pending.pop(message_id, None)

    # -- receiving -------------------------------------------------------------------------------------------

    async def _listen(self) -> None:
        backoff = 0.05
        while True:
            client: aioredis.Redis | None = None
            pubsub: Any = None
            try:
                client = await self._endpoint.node_client(reads_bounded=False)
                subscribed_at = self._clock()
                pubsub = await self._endpoint.subscribe(client)
                await self._resync()
                self._connected, self._last_seen = True, subscribed_at
                self._subscribed.set()
                backoff = 0.05
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self.heartbeat_s)
                    if message is None or message.get("type") not in ("message", "smessage"):
                        continue
                    if not self.trusted:
                        await self._resync()  # silent gap: messages may have been lost
                    await self._receive(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._connected:
                    log.warning("invalidation bus: subscription lost (%s: %s); local copies untrusted",
                                exc.__class__.__name__, exc)
                    self._on_event("lost")
                self._connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            finally:
                for resource in (pubsub, client):
                    if resource is not None:
                        with contextlib.suppress(Exception):
                            await resource.aclose()

    async def _resync(self) -> None:
        self.generation += 1
        self._on_event("resync")
        for resync in self._resyncs:
            await resync()

    async def _receive(self, data: bytes) -> None:
        try:
            message: Message = orjson.loads(data)
            kind = message["t"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if kind == "hb":
            if message.get("from") == self.replica_id:
                # everything published before this heartbeat has been applied: trust up to its send time
                self._last_seen = max(self._last_seen, float(message.get("at", float("-inf"))))
            return
        if kind == "ack":
            pending = self._pending.get(str(message.get("id")))
            if pending is not None and message.get("to") == self.replica_id:
                pending.ack(str(message.get("from")))
                self._on_event("acked")
            return
        self.generation += 1
        self._on_event("received")
        for handler in self._handlers.get(kind, ()):
            await handler(message)
        ack = orjson.dumps({"t": "ack", "id": message.get("id"), "from": self.replica_id, "to": message.get("from")})
        try:
            await self._endpoint.publish(ack)
        except Exception as exc:  # the sender will wait out the lease instead
            log.warning("invalidation bus: ack failed (%s)", exc.__class__.__name__)

    async def _heartbeat(self) -> None:
        while True:
            payload = orjson.dumps({"t": "hb", "from": self.replica_id, "at": self._clock()})
            with contextlib.suppress(Exception):
                await self._endpoint.publish(payload)
            await asyncio.sleep(self.heartbeat_s)
