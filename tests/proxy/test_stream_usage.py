"""The stream_usage stage: a stream is asked for its usage; a client that did not ask does not see the usage chunk,
which is set aside on the reply (the stored answer keeps it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.context import Reply, RequestContext
from proxy.core.sse import with_withheld
from proxy.core.stream_usage import PATCH, StreamUsage, ask_for_usage, usage_only
from proxy.server.request import Request


def sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + (p if isinstance(p, bytes) else orjson.dumps(p)) + b"\n\n" for p in payloads)


CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}],
         "usage": None}
USAGE_CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
STREAM = sse(CHUNK, CHUNK, USAGE_CHUNK, b"[DONE]")


def context(body: dict[str, Any]) -> RequestContext:
    return RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat", request_id="r1",
                          raw_body=orjson.dumps(body), body=dict(body))


def test_usage_is_asked_of_streams_that_lack_it_only() -> None:
    ctx = context({"model": "m", "stream": True, "stream_options": {"other": 1}})
    assert ask_for_usage(ctx) is True and [patch.name for patch in ctx.patches] == [PATCH]
    assert orjson.loads(ctx.outgoing_body())["stream_options"] == {"other": 1, "include_usage": True}
    assert ctx.body is not None and ctx.body["stream_options"] == {"other": 1}, "the client's body stays its own"
    asked = context({"stream": True, "stream_options": {"include_usage": True}})
    assert ask_for_usage(asked) is False and not asked.patches
    assert ask_for_usage(context({"model": "m"})) is False


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in pairwise(points)]


async def pieces(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@settings(max_examples=60)
@given(st.lists(st.integers(0, 10_000), max_size=12), st.booleans())
async def test_the_usage_chunk_is_withheld_from_a_client_that_did_not_ask(cuts: list[int], asked: bool) -> None:
    body: dict[str, Any] = {"model": "m", "stream": True, **({"stream_options": {"include_usage": True}}
                                                             if asked else {})}
    ctx = context(body)

    async def upstream(ctx: RequestContext) -> Reply:
        return Reply(200, chunks=pieces(split(STREAM, cuts)))

    reply = await StreamUsage()(ctx, upstream)
    assert reply.chunks is not None
    seen = b"".join([chunk async for chunk in reply.chunks])
    if asked:
        assert seen == STREAM and reply.withheld == []
    else:
        assert seen == sse(CHUNK, CHUNK, b"[DONE]")
        assert with_withheld(seen, reply.withheld) == STREAM, "what the upstream sent, for the stored answer"


def test_only_usage_chunks_are_usage_only() -> None:
    assert usage_only(sse(USAGE_CHUNK))
    assert not usage_only(sse(CHUNK)) and not usage_only(sse({**CHUNK, "usage": USAGE_CHUNK["usage"]}))
    completed = {"type": "response.completed", "response": {"usage": {"input_tokens": 1}}, "usage": {}}
    assert not usage_only(sse(completed)), "a typed (Responses) event is never withheld"
    assert not usage_only(b'data: {"usage": \n\n') and not usage_only(b": usage\n\n")


def test_withheld_events_go_back_before_done() -> None:
    usage = sse(USAGE_CHUNK)
    assert with_withheld(sse(CHUNK, b"[DONE]"), [usage]) == sse(CHUNK, USAGE_CHUNK, b"[DONE]")
    assert with_withheld(sse(CHUNK), [usage]) == sse(CHUNK, USAGE_CHUNK), "no [DONE]: at the end"
    tight = b'data:{"a":1}\n\ndata:[DONE]\n\n'
    assert with_withheld(tight, [usage]) == b'data:{"a":1}\n\n' + usage + b"data:[DONE]\n\n"
    assert with_withheld(STREAM, []) is STREAM
