"""A stream's token usage: asked of the upstream whatever the client asked, kept from a client that did not ask.

Chat Completions and legacy Completions streams report their usage only when the request sets
``stream_options.include_usage`` (a last chunk with ``choices: []``). The proxy needs it whenever it bills the
request (credits) or may store its answer (a later request replayed from it may ask for usage, whatever this one
asked). :class:`StreamUsage` asks for it (the ``stream_usage.include_usage`` patch of the body sent upstream;
``ctx.body`` stays the client's) and, when the client did not ask, keeps the usage-only chunk from it: a client that
did not ask may not expect a chunk without choices. The chunk kept back is set aside on the reply
(:attr:`~proxy.core.reply.Reply.withheld`), so the answer stored is the upstream's whole answer, its usage included
(:func:`proxy.core.sse.with_withheld`); the credit stage, inside this one, reads it as it passes.

It works on whole SSE events: the bytes of a partial event are held until the event is complete, every other byte
passes unchanged and without delay. Only events that name ``usage`` are parsed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import orjson

from proxy.core.context import Reply, RequestContext
from proxy.core.pipeline import Next
from proxy.core.sse import EventSplitter, event_data
from proxy.core.usage import client_asked_for_usage

PATCH = "stream_usage.include_usage"


def ask_for_usage(ctx: RequestContext) -> bool:
    """Add ``stream_options.include_usage=true`` to a streamed request lacking it (a patch of the body sent
    upstream); ``True`` if it was added."""
    body = ctx.body
    if body is None or body.get("stream") is not True or client_asked_for_usage(body):
        return False
    options = body.get("stream_options")
    merged = {**options, "include_usage": True} if isinstance(options, Mapping) else {"include_usage": True}
    ctx.patch(PATCH, lambda sent: {**sent, "stream_options": merged})
    return True


class StreamUsage:
    """Ask a stream for its usage; withhold the usage chunk from a client that did not ask for it."""

    name = "stream_usage"
    needs: frozenset[str] = frozenset()
    gives: frozenset[str] = frozenset()

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        asked = ask_for_usage(ctx)
        reply = await call_next(ctx)
        if asked and reply.chunks is not None:
            reply.chunks = _withhold_usage(reply, reply.chunks)
        return reply


async def _withhold_usage(reply: Reply, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    events = EventSplitter()
    async for chunk in chunks:
        kept = []
        for event in events.feed(chunk):
            if usage_only(event):
                reply.withheld.append(event)
            else:
                kept.append(event)
        if kept:
            yield b"".join(kept)
    rest = events.rest()
    if rest:
        yield rest


def usage_only(event: bytes) -> bool:
    """Whether an SSE event is a usage chunk: a JSON chunk with a ``usage`` object and no choices (a typed event,
    as the Responses API sends, never is)."""
    if b'"usage"' not in event:
        return False
    data = event_data(event)
    if data is None or not data.startswith(b"{"):
        return False
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return (isinstance(payload, dict) and "type" not in payload and isinstance(payload.get("usage"), dict)
            and not payload.get("choices"))
