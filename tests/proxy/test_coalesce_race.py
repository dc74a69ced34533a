"""A request that missed the fastest tier just before the leader stored its answer, and reached coalescing just
after the leader's flight ended, is answered from what was stored: one upstream call, whatever the timing."""

from __future__ import annotations

import asyncio

from normalizer.cache_control import CachePolicy
from proxy.answers.coalesce import Coalesce, Flights
from proxy.answers.replies import ExactLookup, StoreResponse
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import CHAT as CHAT_API
from proxy.core.pipeline import Next, Pipeline
from proxy.server.request import Request
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier

CHAT = "/v1/chat/completions"
POLICY = CachePolicy(may_read=True, may_store=True, max_age=None, ttl=None, namespace="default", force_refresh=False)


class SlowerTier:
    """Stands for a slower tier's lookup (L3 on a loaded disk): holds the request it is told to hold."""

    name = "slow"
    needs = frozenset({"cache_key"})
    gives: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.holding: str | None = None
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        if ctx.request_id == self.holding:
            self.held.set()
            await self.release.wait()
        return await call_next(ctx)


class Keyed:
    """Stands for cache_control and canonicalize: every request here is the same request."""

    name = "canonicalize"
    needs: frozenset[str] = frozenset()
    gives = frozenset({"cache_key", "cache_policy"})

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        ctx.cache_key, ctx.cache_policy = "k", POLICY
        return await call_next(ctx)


def _ctx(request_id: str) -> RequestContext:
    return RequestContext(request=Request("POST", CHAT), route="chat", request_id=request_id)


async def _served(pipeline: Pipeline, ctx: RequestContext) -> Reply:
    reply = await pipeline(ctx)
    await reply.finish(True, reply.body or b"")
    return reply


async def test_a_request_racing_with_the_store_is_a_hit() -> None:
    l1 = ResponseTier("l1", MemoryStore(make_policy("lru", 1 << 20)))
    slow = SlowerTier()
    calls = 0

    async def upstream(ctx: RequestContext) -> Reply:
        nonlocal calls
        calls += 1
        return Reply(status=200, body=b'{"id": "a", "object": "chat.completion", "choices": []}')

    pipeline = Pipeline([Keyed(), StoreResponse(l1, endpoint=CHAT_API), ExactLookup(l1), slow,
                         Coalesce(endpoint=CHAT_API, wait_s=5.0, flights=Flights(), recheck=l1)], upstream)
    slow.holding = "late"
    late_ctx = _ctx("late")
    late = asyncio.create_task(_served(pipeline, late_ctx))
    await slow.held.wait()  # it missed L1: nothing was stored yet
    await _served(pipeline, _ctx("leader"))  # leads, answers, stores, lands
    slow.release.set()
    await late
    assert calls == 1 and late_ctx.outcome is not None and late_ctx.outcome.status == "HIT"
