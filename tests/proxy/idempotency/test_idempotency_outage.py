"""The idempotency stage when Redis dies while the first request with a key runs: the answer still reaches the
client (it was produced, and charged, upstream), as the module promises for an unreachable store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.context import Reply, RequestContext
from proxy.core.sse import DONE
from proxy.idempotency.redis_store import RedisIdempotencyStore
from proxy.idempotency.stage import HEADER, Idempotency
from proxy.server.request import Request
from tests.support.processes import RedisServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = orjson.dumps({"id": "chatcmpl-1", "choices": [{"message": {"role": "assistant", "content": "hello"}}]})
PIECES = [b'data: {"choices":[{"delta":{"content":"hel"}}]}\n\n', b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n',
          DONE]


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: the test stops it."""
    server = RedisServer.start()
    yield server
    server.stop()


def context() -> RequestContext:
    raw = orjson.dumps(BODY)
    headers = CIMultiDictProxy(CIMultiDict({HEADER: "retry-1", "Content-Type": "application/json"}))
    return RequestContext(request=Request("POST", "/v1/chat/completions", headers, raw), route="chat",
                          request_id="req-1", raw_body=raw, body=BODY, user="ann", tenant="acme")


async def test_an_answer_is_delivered_when_redis_dies_during_the_upstream_call(redis: RedisServer) -> None:
    store = RedisIdempotencyStore.from_url(redis.url)

    async def upstream(ctx: RequestContext) -> Reply:
        redis.stop()  # Redis goes away while the upstream answers
        return Reply(200, CIMultiDict({"Content-Type": "application/json"}), body=ANSWER)

    try:
        reply = await Idempotency(store)(context(), upstream)
        assert reply.status == 200 and reply.body == ANSWER
    finally:
        await store.close()


async def test_a_stream_runs_to_its_end_when_redis_dies_during_it(redis: RedisServer) -> None:
    store = RedisIdempotencyStore.from_url(redis.url)

    async def pieces() -> AsyncIterator[bytes]:
        yield PIECES[0]
        redis.stop()  # Redis goes away in the middle of the stream
        for piece in PIECES[1:]:
            yield piece

    async def upstream(ctx: RequestContext) -> Reply:
        return Reply(200, CIMultiDict({"Content-Type": "text/event-stream"}), chunks=pieces())

    try:
        reply = await Idempotency(store)(context(), upstream)
        assert reply.chunks is not None
        relayed = [chunk async for chunk in reply.chunks]
        await reply.finish(True, b"".join(relayed))
        assert relayed == PIECES
    finally:
        await store.close()
