"""Usage of streamed replies: ask the upstream for it, read it on the way, hide it if the client did not ask.

A streamed chat completion reports its token usage only when the request carries ``stream_options:
{"include_usage": true}``. The credits stage asks for it (:func:`ask_upstream_for_usage`, a patch of the
body sent upstream) once it holds a reservation, and wraps the reply's chunks in a :class:`UsageChunkFilter`,
which reads the usage chunk as it passes and, when the client did not ask for it, leaves it out of what the client
sees (a client that did not ask may not expect a chunk with empty ``choices``).

The filter works on whole SSE events (separated by a blank line): bytes of a partial event are held until the
event is complete, every other byte passes unchanged and without delay. It also counts what it relayed of the
completion (the events carrying generated text or tool-call arguments, and their characters), so that a stream the
client abandons is billed for what the upstream produced (:attr:`UsageChunkFilter.relayed_completion_tokens`), and
notes whether the upstream broke the stream off (:attr:`UsageChunkFilter.upstream_broke`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from proxy.core.context import RequestContext
from proxy.core.sse import EventSplitter, event_data
from proxy.core.usage import Usage, usage_from_json
from proxy.credits.pricing import CHARS_PER_TOKEN


def client_asked_for_usage(body: Mapping[str, Any] | None) -> bool:
    """Whether the client's own request has ``stream_options.include_usage`` set."""
    options = body.get("stream_options") if body else None
    return isinstance(options, Mapping) and options.get("include_usage") is True


def ask_upstream_for_usage(ctx: RequestContext) -> bool:
    """Add ``stream_options.include_usage=true`` to a streamed request lacking it (the ``credits.include_usage``
    patch of the body sent upstream; ``ctx.body`` stays the client's); ``True`` if it was added.

    Called by the credits stage of an endpoint whose streams report usage only when asked
    (:attr:`proxy.core.endpoints.Endpoint.usage_on_request`: chat and completions; a Responses stream always reports it,
    and its API has no such option). It acts only when the credits stage holds a reservation (``ctx.reservation``),
    because that stage is what reads the usage and hides the extra chunk from a client that did not ask for it.
    """
    body = ctx.body
    if ctx.reservation is None or body is None or body.get("stream") is not True or client_asked_for_usage(body):
        return False
    options = body.get("stream_options")
    merged = {**options, "include_usage": True} if isinstance(options, Mapping) else {"include_usage": True}
    ctx.patch("credits.include_usage", lambda sent: {**sent, "stream_options": merged})
    return True




class UsageChunkFilter:
    """Pass SSE chunks through, remember the last usage seen, drop usage-only chunks when ``strip`` is set; count
    the completion relayed so far."""

    def __init__(self, *, strip: bool) -> None:
        self.strip = strip
        self.usage: Usage | None = None
        self.upstream_broke = False
        """The upstream's stream failed (reset, timeout, undecodable) rather than the client going away."""
        self.completion_events = 0
        self.completion_chars = 0

    @property
    def relayed_completion_tokens(self) -> int:
        """Estimated completion tokens relayed: one per event with generated text, at least one per 4 characters
        (exact for servers that send one token per event: vLLM, SGLang, llama.cpp, OpenAI)."""
        return max(self.completion_events, -(-self.completion_chars // CHARS_PER_TOKEN))

    async def filter(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        events = EventSplitter()
        try:
            async for chunk in chunks:
                out = [event for event in events.feed(chunk) if self._keep(event)]
                if out:
                    yield b"".join(out)
        except Exception:  # the upstream's side failed; a client hanging up closes this generator instead
            self.upstream_broke = True
            raise
        rest = events.rest()
        if rest and self._keep(rest):
            yield rest

    def _keep(self, event: bytes) -> bool:
        payload = _data_of(event)
        if payload is None:
            return True
        generated = generated_chars(payload)
        if generated:
            self.completion_events += 1
            self.completion_chars += generated
        usage = usage_from_json(payload)
        if usage is None:
            return True
        self.usage = usage
        usage_only = "type" not in payload and not payload.get("choices")  # typed events are Responses events
        return not (self.strip and usage_only)


def generated_chars(chunk: Mapping[str, Any]) -> int:
    """Characters of generated output in one stream chunk: chat deltas (content, reasoning, tool-call arguments),
    legacy completion text, and the Responses API's typed ``*.delta`` events (text, reasoning, arguments)."""
    delta = chunk.get("delta")
    if isinstance(delta, str) and str(chunk.get("type", "")).endswith(".delta"):
        return len(delta)
    total = 0
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, Mapping):
            continue
        text = choice.get("text")
        total += len(text) if isinstance(text, str) else 0
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            continue
        for field in ("content", "reasoning_content", "reasoning"):
            value = delta.get(field)
            total += len(value) if isinstance(value, str) else 0
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
            total += len(arguments) if isinstance(arguments, str) else 0
    return total


def _data_of(event: bytes) -> dict[str, Any] | None:
    data = event_data(event)
    if data is None or not data.startswith(b"{"):
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None
