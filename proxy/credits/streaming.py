"""Usage of streamed replies, read on the way.

A streamed chat completion reports its token usage only when the request carries ``stream_options:
{"include_usage": true}``; the proxy asks for it, and keeps the usage chunk from a client that did not ask, in the
stream_usage stage outside the credits stage (:mod:`proxy.core.stream_usage`). The credits stage wraps the reply's
chunks in a :class:`UsageMeter`, which reads the usage chunk as it passes.

The meter works on whole SSE events (separated by a blank line) and passes every byte unchanged. It also counts what
it relayed of the completion (the events carrying generated text or tool-call arguments, and their characters), so
that a stream the client abandons is billed for what the upstream produced
(:attr:`UsageMeter.relayed_completion_tokens`), and notes whether the upstream broke the stream off
(:attr:`UsageMeter.upstream_broke`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from proxy.core.sse import EventSplitter, event_data
from proxy.core.usage import Usage, usage_from_json
from proxy.credits.pricing import CHARS_PER_TOKEN


class UsageMeter:
    """Pass SSE chunks through, remember the last usage seen; count the completion relayed so far."""

    def __init__(self) -> None:
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
                for event in events.feed(chunk):
                    self._read(event)
                yield chunk
        except Exception:  # the upstream's side failed; a client hanging up closes this generator instead
            self.upstream_broke = True
            raise
        rest = events.rest()
        if rest:
            self._read(rest)

    def _read(self, event: bytes) -> None:
        payload = _data_of(event)
        if payload is None:
            return
        generated = generated_chars(payload)
        if generated:
            self.completion_events += 1
            self.completion_chars += generated
        usage = usage_from_json(payload)
        if usage is not None:
            self.usage = usage


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
