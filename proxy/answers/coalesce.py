"""Request coalescing: identical concurrent misses (same exact key) make one upstream call.

The first miss leads: its reply is teed into a :class:`Flight`. Followers with the same key wait — at most
``wait_s`` — and then:

- a streaming follower of a streaming leader receives the leader's chunks as they are produced (from the first);
- any other follower receives the leader's complete answer once it has finished (replayed as SSE if it asked
  for a stream), exactly like a cache hit;
- if the leader fails (exception, non-200 status, aborted stream) followers go upstream on their own: an error
  is never fanned out as an answer;
- past the bound a follower goes upstream on its own and its result is not stored (the leader's will be).

A request that looked up the tiers just before the leader stored its answer, and reaches this stage just after the
leader's flight ended (a slow lookup in a slower tier in between: a loaded machine, a cold disk), would otherwise
lead a second upstream call. So a key whose flight ended recently (the last ``max_landed`` such keys) is looked up
again in the fastest answer tier (``recheck``) before leading: the answer stored meanwhile is a ``HIT``.

Keys carry the tenant (and, for user-scoped requests in private namespaces, the user: see
``proxy.answers.cache_policy``), so coalescing never crosses tenants, nor users where answers are private. The
table of flights (:class:`Flights`, one per process, shared by the coalescing stages of every kind of request) is
bounded (``max_flights``); beyond it requests simply go upstream uncoalesced.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from proxy.answers.replies import FOLLOWER, StillStored, complete_body, hit_reply, servable
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import Endpoint
from proxy.core.outcome import COALESCED, CacheStatus, Outcome, exact_hit
from proxy.core.pipeline import Named, Next
from proxy.core.reply import Complete
from proxy.upstream.client import UpstreamStreamError
from tiers.entry import CachedResponse
from tiers.response_tier import ResponseTier

if TYPE_CHECKING:
    from proxy.answers.settings import CacheSettings


@dataclass
class Flight:
    """One upstream call that several requests wait on."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    streamed: bool = False
    failed: bool = False
    chunks: list[bytes] = field(default_factory=list)
    answer: Complete | None = None
    followers: int = 0

    def fail(self) -> None:
        self.failed = True
        self.ready.set()
        self.done.set()
        self.changed.set()


@dataclass
class Flights:
    """The upstream calls in flight that identical requests may wait on (keys hold the request kind)."""

    max_flights: int = 10_000
    table: dict[str, Flight] = field(default_factory=dict)
    max_landed: int = 4096
    landed: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """Keys whose flight ended recently, newest last."""
    timeouts: int = 0
    """Followers that waited past the bound and went upstream on their own."""

    def __len__(self) -> int:
        return len(self.table)


class Coalesce:
    """Share one upstream call among identical in-flight misses."""

    name = "coalesce"
    needs = frozenset({"cache_key", "cache_policy"})
    gives: frozenset[Named] = frozenset({FOLLOWER, "entry", "outcome"})
    live_keys = frozenset({"cache.coalesce_wait_s"})

    def __init__(self, *, endpoint: Endpoint, wait_s: float, flights: Flights,
                 recheck: ResponseTier | None = None, still_stored: StillStored | None = None) -> None:
        """``recheck``: where a finished leader stored its answer (the fastest answer tier); ``still_stored``: as
        for :class:`~proxy.answers.replies.ExactLookup`."""
        self.endpoint = endpoint
        self.wait_s = wait_s
        self.flights = flights
        self.recheck = recheck
        self.still_stored = still_stored

    def configure(self, cache: CacheSettings) -> None:
        self.wait_s = cache.coalesce_wait_s

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key = ctx.cache_key
        if key is None or ctx.handoffs.get(FOLLOWER):
            return await call_next(ctx)
        flight = self.flights.table.get(key)
        if flight is not None:
            reply = await self._follow(ctx, flight)
            if reply is not None:
                return reply
            return await call_next(ctx)
        if key in self.flights.landed and (stored := await self._stored_meanwhile(ctx, key)) is not None:
            return stored
        if len(self.flights) >= self.flights.max_flights:
            return await call_next(ctx)
        return await self._lead(ctx, key, call_next)

    async def _stored_meanwhile(self, ctx: RequestContext, key: str) -> Reply | None:
        """The answer a leader that just finished stored while this request looked up the slower tiers."""
        policy = ctx.cache_policy
        if self.recheck is None or policy is None or not policy.may_read:
            return None
        entry = await self.recheck.get(key)
        if entry is None or not await servable(entry, ctx, policy, self.still_stored):
            return None
        return hit_reply(ctx, entry, exact_hit(self.recheck.name))

    async def _lead(self, ctx: RequestContext, key: str, call_next: Next) -> Reply:
        flight = Flight()
        self.flights.table[key] = flight
        try:
            reply = await call_next(ctx)
        except BaseException:
            self._land(key, flight)
            flight.fail()
            raise
        if reply.status != 200:
            self._land(key, flight)
            flight.fail()
            return reply
        flight.headers = CIMultiDict(reply.headers)
        if reply.chunks is not None:
            flight.streamed = True
            reply.chunks = self._tee(reply.chunks, flight)

        async def finished(done_reply: Reply, ok: bool, body: bytes) -> None:
            self._land(key, flight)
            flight.answer = complete_body(done_reply, body, self.endpoint) if ok else None
            if flight.answer is None:
                flight.fail()
            else:
                flight.done.set()
                flight.changed.set()

        reply.on_finish(finished)
        flight.ready.set()
        return reply

    def _land(self, key: str, flight: Flight) -> None:
        if self.flights.table.get(key) is flight:
            del self.flights.table[key]
            landed = self.flights.landed
            landed[key] = None
            landed.move_to_end(key)
            if len(landed) > self.flights.max_landed:
                landed.popitem(last=False)

    @staticmethod
    async def _tee(source: AsyncIterator[bytes], flight: Flight) -> AsyncIterator[bytes]:
        async for chunk in source:
            flight.chunks.append(chunk)
            flight.changed.set()
            yield chunk

    async def _follow(self, ctx: RequestContext, flight: Flight) -> Reply | None:
        """The follower's reply, or ``None`` to go upstream on its own."""
        ctx.handoffs[FOLLOWER] = True
        flight.followers += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        try:
            await asyncio.wait_for(flight.ready.wait(), self.wait_s)
            if flight.streamed and ctx.stream and not flight.failed:
                ctx.outcome = Outcome(CacheStatus.MISS, COALESCED)
                headers = CIMultiDict(flight.headers)
                headers["X-Cache-Coalesced"] = "true"
                return Reply(status=200, headers=headers, chunks=self._replay(flight, self.wait_s))
            await asyncio.wait_for(flight.done.wait(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            self.flights.timeouts += 1
            return None
        if flight.failed or flight.answer is None:
            ctx.handoffs[FOLLOWER] = False
            return None
        entry = CachedResponse(body=flight.answer.body, kind=self.endpoint.kind, meta=flight.answer.meta)
        return hit_reply(ctx, entry, Outcome(CacheStatus.MISS, COALESCED), extra={"X-Cache-Coalesced": "true"})

    @staticmethod
    async def _replay(flight: Flight, gap_s: float) -> AsyncIterator[bytes]:
        sent = 0
        while True:
            while sent < len(flight.chunks):
                yield flight.chunks[sent]
                sent += 1
            if flight.failed:
                raise UpstreamStreamError("the shared upstream stream broke off")
            if flight.done.is_set():
                return
            flight.changed.clear()
            if sent < len(flight.chunks):
                continue
            try:
                await asyncio.wait_for(flight.changed.wait(), gap_s)
            except TimeoutError:
                raise UpstreamStreamError("the shared upstream stream stalled") from None
