"""Invalidation bus: Redis pub/sub between proxy replicas, with acknowledgements and a self-fencing lease.

Why: every replica keeps a near cache (in-process copies of shared entries) and a local copy of the knowledge
versions. When one replica deletes entries or bumps a version, every other replica must drop its copies before
the admin call returns. Redis pub/sub carries the messages; no protocol between replicas other than Redis.

Channel: ``<prefix>:{bus}:events``. Standalone Redis: ``PUBLISH``/``SUBSCRIBE``. Redis Cluster: sharded pub/sub
(``SPUBLISH``/``SSUBSCRIBE``) on the master that owns the channel's slot — every replica subscribes on that one
node, so the ``SPUBLISH`` reply counts every subscriber (a plain cluster ``PUBLISH`` counts only the clients of
the node it was sent to). After a failover the owner is looked up again from the cluster's topology.

Messages (JSON): ``{"t": kind, "id": ..., "from": replica, ...}``; kinds ``keys`` (``keys``: list), ``evicted``
(``keys`` the shared L1 pushed out: near copies go, nothing else), ``clear``, ``ver`` (``tenant``, ``namespace``,
``version``), ``hb`` (heartbeat) and ``ack`` (``id`` of the acknowledged message, ``to``: its sender). A replica
applies a message through the handlers registered for its kind and then publishes an ``ack``.

Membership: every replica keeps a live-lease entry in ``<prefix>:{bus}:members`` (a sorted set, same Cluster
slot as the channel; member = replica id, score = expiry in Redis's own clock, ``TIME``, so replica clocks do not
matter). It registers when its subscription is made and refreshes the entry with every heartbeat (expiry
``lease_s`` ahead), only while it believes its subscription alive; it removes the entry when it stops or notices
the subscription lost. The set has no TTL of its own (a ``volatile-*`` eviction policy never touches it);
expired members are dropped on every refresh.

The guarantee (see docs/scale-out.md): :meth:`InvalidationBus.broadcast` reads the live members, publishes, and
returns when every live member and at least as many receivers as ``PUBLISH`` counted acknowledged — or, when some
did not within ``ack_timeout_s``, only after ``lease_s`` has passed since the publish. A replica trusts its local
copies only until ``lease_s`` after the *send* time of the last of its own heartbeats (every ``heartbeat_s``) that
it has received and processed (:attr:`trusted`); a heartbeat is sent only after the registry entry was refreshed,
so a replica's trust never outlasts its entry. Messages on the channel arrive in publish order and are applied
one by one, so a replica that has not applied a message has processed only heartbeats sent before that message
was published: its trust ends before the sender's ``lease_s`` wait does. On every (re)subscription, and after a
silent gap longer than the lease, the ``resync`` callbacks run (drop the near cache, reload versions) before the
replica trusts its copies again. A replica whose subscription Redis has already closed but which has not noticed
(not counted by ``PUBLISH``) is still a live member, so the sender waits for it or for its lease; one that
crashed without deregistering makes broadcasts wait out the lease until its entry expires (at most ``lease_s``).

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

from tiers.redis_connect import KEY_PREFIX, is_sentinel, sentinel_master

log = logging.getLogger("ragproxy.bus")

Message = dict[str, Any]
Handler = Callable[[Message], Awaitable[None]]
Resync = Callable[[], Awaitable[None]]


class BusUnavailable(Exception):
    """The invalidation could not be published (Redis unreachable): the admin call must fail loudly."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one broadcast went: ``expected`` acknowledgements (the larger of the ``PUBLISH`` reply and the live
    members), ``acked`` of them in time, the live members that did not acknowledge (``missing``)."""

    message_id: str
    expected: int
    acked: int
    complete: bool
    waited_s: float
    fenced: bool  # some receiver did not acknowledge: the call waited out the lease
    missing: tuple[str, ...] = ()


@dataclass(slots=True)
class Pending:
    """Acknowledgements of one message: complete once ``expected`` is known and reached and every live member
    acknowledged."""

    acked: set[str] = field(default_factory=set)
    expected: int | None = None
    members: frozenset[str] = frozenset()
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def ack(self, replica: str) -> None:
        self.acked.add(replica)
        self._check()

    def expect(self, count: int, members: frozenset[str] = frozenset()) -> None:
        """``count``: receivers counted by ``PUBLISH``; ``members``: replicas with a live lease."""
        self.expected = count
        self.members = members
        self._check()

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(sorted(self.members - self.acked))

    def _check(self) -> None:
        if self.expected is not None and len(self.acked) >= self.expected and self.members <= self.acked:
            self.done.set()


def lease_valid(connected: bool, last_seen: float, now: float, lease_s: float) -> bool:
    """A replica may serve its local copies only while the bus delivered something within the lease."""
    return connected and now - last_seen < lease_s


HEARTBEAT_S = 0.5
"""Period of a replica's own heartbeat by default (``redis.bus_heartbeat_s``)."""
LEASE_S = 3.0
"""Silence after which a replica stops serving its near copies, by default (``redis.bus_lease_s``)."""
ACK_TIMEOUT_S = 1.0
"""How long a broadcast waits for acknowledgements by default (``redis.bus_ack_timeout_s``)."""

_NOW_MS = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_REGISTER = _NOW_MS + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return now
"""

_LIVE = _NOW_MS + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""


class _Endpoint:
    """Where to publish and subscribe: the standalone server (or Sentinel's master), or the cluster master owning
    the channel."""

    def __init__(self, url: str, channel: str, members_key: str, *, cluster: bool, timeout_s: float) -> None:
        self.url = url.replace("+cluster://", "://")
        self.channel = channel
        self.members_key = members_key
        self.cluster = cluster or "+cluster://" in url
        self.timeout_s = timeout_s
        self._cluster_client: RedisCluster | None = None
        self._publisher: aioredis.Redis | None = None

    async def node_client(self, *, reads_bounded: bool) -> aioredis.Redis:
        """A fresh client to the node the channel lives on (``reads_bounded``: replies time out, not for
        a subscription that waits for messages)."""
        read_timeout = self.timeout_s if reads_bounded else None
        if is_sentinel(self.url):  # the current master, found through the Sentinels
            return sentinel_master(self.url, timeout_s=self.timeout_s, read_timeout_s=read_timeout, max_connections=8)
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

    async def _on_node(self, call: Callable[[aioredis.Redis], Awaitable[Any]]) -> Any:
        """Run ``call`` on the publishing connection, re-resolving the node once after a failure."""
        for attempt in (1, 2):
            try:
                if self._publisher is None:
                    self._publisher = await self.node_client(reads_bounded=True)
                return await call(self._publisher)
            except Exception:
                await self._drop_publisher()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def publish(self, payload: bytes) -> int:
        """Publish once; the number of receivers."""
        if self.cluster:
            return int(await self._on_node(lambda node: node.spublish(self.channel, payload)))
        return int(await self._on_node(lambda node: node.publish(self.channel, payload)))

    async def register(self, replica: str, lease_ms: int) -> None:
        """Refresh ``replica``'s live-lease entry (expiry ``lease_ms`` ahead on Redis's clock)."""
        await self._on_node(lambda node: node.eval(_REGISTER, 1, self.members_key, replica, lease_ms))

    async def deregister(self, replica: str) -> None:
        await self._on_node(lambda node: node.zrem(self.members_key, replica))

    async def live_members(self) -> frozenset[str]:
        """Replicas whose live lease has not expired."""
        reply = await self._on_node(lambda node: node.eval(_LIVE, 1, self.members_key))
        return frozenset(m.decode() if isinstance(m, bytes) else str(m) for m in reply)

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

    def __init__(self, url: str, *, cluster: bool = False, prefix: str = KEY_PREFIX, replica_id: str | None = None,
                 heartbeat_s: float = HEARTBEAT_S, lease_s: float = LEASE_S, ack_timeout_s: float = ACK_TIMEOUT_S,
                 timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 on_event: Callable[[str], None] | None = None) -> None:
        """``heartbeat_s``: period of this replica's own heartbeat; ``lease_s``: silence after which local
        copies are no longer served (> several heartbeats); ``ack_timeout_s``: how long a broadcast waits for
        acknowledgements before it waits out the lease instead; ``on_event``: told ``sent``, ``received``,
        ``acked``, ``incomplete``, ``resync``, ``lost`` (metrics)."""
        if lease_s <= heartbeat_s:
            raise ValueError("lease_s must be longer than heartbeat_s")
        self.channel = f"{prefix}:{{bus}}:events"
        self.members_key = f"{prefix}:{{bus}}:members"
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self.ack_timeout_s = ack_timeout_s
        self._endpoint = _Endpoint(url, self.channel, self.members_key, cluster=cluster, timeout_s=timeout_s)
        self._clock = clock
        self._on_event = on_event or (lambda _event: None)
        self._handlers: dict[str, list[Handler]] = {}
        self._resyncs: list[Resync] = []
        self._pending: dict[str, Pending] = {}
        self._connected = False
        self._last_seen = float("-inf")
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._subscribed = asyncio.Event()
        self.members = 0
        """Replicas with a live lease, this one included, as the last heartbeat read them (0 before the first)."""
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
        self._stopping = False
        self._tasks = [asyncio.create_task(self._listen(), name="bus-listen"),
                       asyncio.create_task(self._heartbeat(), name="bus-heartbeat")]
        try:
            await asyncio.wait_for(self._subscribed.wait(), wait_s)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Stop listening and heartbeating. Bounded: a task that does not end within ``ack_timeout_s`` of its
        cancellation (seen rarely with a subscription read cancelled inside redis-py) is left behind, logged."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=self.ack_timeout_s)
            for task in done:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    task.result()
            if pending:
                log.warning("invalidation bus: %s did not stop within %.1fs; left behind",
                            ", ".join(t.get_name() for t in pending), self.ack_timeout_s)
        self._tasks = []
        self._connected = False
        await self._leave()
        await self._endpoint.close()

    async def _leave(self) -> None:
        """Remove this replica's live-lease entry (best effort: otherwise it expires within ``lease_s``)."""
        try:
            await asyncio.wait_for(self._endpoint.deregister(self.replica_id), self.ack_timeout_s)
        except Exception as exc:
            log.debug("invalidation bus: deregistration failed (%s)", exc.__class__.__name__)

    # -- sending ---------------------------------------------------------------------------------------------

    async def broadcast(self, kind: str, **fields: Any) -> Delivery:
        """Publish one message and wait until every receiver applied it (or the lease ran out); see module doc."""
        message_id = uuid.uuid4().hex
        pending = self._pending[message_id] = Pending()
        started = self._clock()
        payload = orjson.dumps({"t": kind, "id": message_id, "from": self.replica_id, **fields})
        try:
            try:
                members = await self._endpoint.live_members()
                receivers = await self._endpoint.publish(payload)
            except Exception as exc:
                raise BusUnavailable(f"invalidation bus: publish failed ({exc.__class__.__name__}: {exc})") from exc
            self._on_event("sent")
            pending.expect(receivers, members)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pending.done.wait(), self.ack_timeout_s)
            fenced = not pending.done.is_set()
            if fenced:
                self._on_event("incomplete")
                remaining = self.lease_s - (self._clock() - started)
                if remaining > 0:
                    await asyncio.sleep(remaining)
            expected = max(receivers, len(members))
            return Delivery(message_id, expected, min(len(pending.acked), expected), not fenced,
                            self._clock() - started, fenced, pending.missing)
        finally:
            self._pending.pop(message_id, None)

    # -- receiving -------------------------------------------------------------------------------------------

    async def _listen(self) -> None:
        backoff = 0.05
        while not self._stopping:
            client: aioredis.Redis | None = None
            pubsub: Any = None
            try:
                client = await self._endpoint.node_client(reads_bounded=False)
                subscribed_at = self._clock()
                pubsub = await self._endpoint.subscribe(client)
                await self._endpoint.register(self.replica_id, self._lease_ms)  # subscribed: it will ack
                await self._resync()
                self._connected, self._last_seen = True, subscribed_at
                self._subscribed.set()
                backoff = 0.05
                while not self._stopping:  # a cancellation absorbed by a timed read still ends the loop
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
                    await self._leave()  # not trusted any more: no broadcast needs to wait for this replica
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

    @property
    def _lease_ms(self) -> int:
        return max(1, round(self.lease_s * 1000))

    async def _heartbeat(self) -> None:
        """Refresh the live lease, then publish the heartbeat (never the other way round: trust, which the
        heartbeat extends, must not outlast the registry entry)."""
        while True:
            if self._connected:
                at = self._clock()
                try:
                    await self._endpoint.register(self.replica_id, self._lease_ms)
                    await self._endpoint.publish(orjson.dumps({"t": "hb", "from": self.replica_id, "at": at}))
                    self.members = len(await self._endpoint.live_members())
                except Exception as exc:  # no heartbeat: this replica's trust runs out; the listener notices
                    log.debug("invalidation bus: heartbeat failed (%s)", exc.__class__.__name__)
            await asyncio.sleep(self.heartbeat_s)
